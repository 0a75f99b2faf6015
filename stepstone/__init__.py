"""Stepstone: durable execution for Python.

Each ``step.run(...)`` is a checkpointed unit of work: retried on failure, never
re-run once it succeeded, resumable after a crash, a deploy or a bug fix.
"""

from stepstone.app import App
from stepstone.client import Client
from stepstone.context import Context
from stepstone.errors import (
    AuthenticationError,
    ConfigError,
    ErrorInfo,
    ExpressionError,
    InvalidStateError,
    LimitExceededError,
    NonRetriableError,
    NotFoundError,
    RetryAfterError,
    RunTimeoutError,
    SerializationError,
    ServerUnavailableError,
    StepError,
    StepstoneError,
    StoreError,
)
from stepstone.events import Event, InvalidEventError
from stepstone.function import (
    Backoff,
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
from stepstone.inventory import FunctionInfo
from stepstone.runs import Run, Span, StepRecord
from stepstone.server import asgi
from stepstone.triggers import on_cron, on_event

__all__ = [
    # the application
    "App",
    "Context",
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
    "FunctionInfo",
    # runs
    "Run",
    "Span",
    "StepRecord",
    # errors
    "AuthenticationError",
    "ConfigError",
    "ErrorInfo",
    "ExpressionError",
    "InvalidEventError",
    "InvalidStateError",
    "LimitExceededError",
    "NonRetriableError",
    "NotFoundError",
    "RetryAfterError",
    "RunTimeoutError",
    "SerializationError",
    "ServerUnavailableError",
    "StepError",
    "StepstoneError",
    "StoreError",
]
