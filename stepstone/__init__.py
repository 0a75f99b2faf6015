"""Stepstone: durable execution for Python.

Each ``step.run(...)`` is a checkpointed unit of work: retried on failure, never
re-run once it succeeded, resumable after a crash, a deploy or a bug fix.
"""

from stepstone import testing
from stepstone.app import App
from stepstone.checking import CheckReport
from stepstone.client import Client
from stepstone.context import Context
from stepstone.divergence import Divergence
from stepstone.encryption import EncryptionError, EncryptionMiddleware, is_encrypted
from stepstone.endpoint import serve, serve_wsgi
from stepstone.errors import (
    AuthenticationError,
    ConfigError,
    EndpointError,
    ErrorInfo,
    ExpressionError,
    InvalidStateError,
    LimitExceededError,
    NondeterminismError,
    NonRetriableError,
    NotFoundError,
    RetryAfterError,
    RunTimeoutError,
    SerializationError,
    ServerUnavailableError,
    StepError,
    StepstoneError,
    StepTimeoutError,
    StoreError,
    StoreUnavailableError,
)
from stepstone.events import Event, InvalidEventError
from stepstone.flow import (
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
)
from stepstone.function import Backoff
from stepstone.inventory import FunctionInfo
from stepstone.middleware import Middleware
from stepstone.runs import Run, Span, StepRecord
from stepstone.server import asgi
from stepstone.steps import AsyncStep, SyncStep
from stepstone.tracing import OpenTelemetryMiddleware
from stepstone.triggers import on_cron, on_event

__all__ = [
    # the application
    "App",
    "Context",
    "AsyncStep",
    "SyncStep",
    "Event",
    # triggers
    "on_cron",
    "on_event",
    # configuration
    "Backoff",
    "Batch",
    "CancelOn",
    "Concurrency",
    "Debounce",
    "Priority",
    "RateLimit",
    "Singleton",
    "Throttle",
    "Timeouts",
    # remote use and serving
    "Client",
    "asgi",
    "serve",
    "serve_wsgi",
    "FunctionInfo",
    # runs
    "Run",
    "CheckReport",
    "Divergence",
    "Span",
    "StepRecord",
    # middleware
    "EncryptionMiddleware",
    "Middleware",
    "OpenTelemetryMiddleware",
    "is_encrypted",
    # testing on a virtual clock
    "testing",
    # errors
    "AuthenticationError",
    "ConfigError",
    "EncryptionError",
    "EndpointError",
    "ErrorInfo",
    "ExpressionError",
    "InvalidEventError",
    "InvalidStateError",
    "LimitExceededError",
    "NondeterminismError",
    "NonRetriableError",
    "NotFoundError",
    "RetryAfterError",
    "RunTimeoutError",
    "SerializationError",
    "ServerUnavailableError",
    "StepError",
    "StepTimeoutError",
    "StepstoneError",
    "StoreError",
    "StoreUnavailableError",
]
