"""OpenTelemetry (optional extra ``stepstone[otel]``).

``current_context()`` captures the W3C trace context of the code sending an
event; it is stored with the event. ``OpenTelemetryMiddleware`` exports one span
per invocation (``stepstone.run <function>``), parented under that context, with
one child span per executed step attempt. Attributes: ``stepstone.run_id``,
``stepstone.function_id``, ``stepstone.step_id``, ``stepstone.attempt``.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from stepstone.middleware import Middleware

if TYPE_CHECKING:
    from stepstone.context import Context


def current_context() -> str | None:
    """The active trace context as JSON (``traceparent``...), or ``None``.

    No span can be active in a process that never imported OpenTelemetry's
    API: a send then neither imports it (a tenth of a second, once) nor asks it."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier) if carrier else None


class OpenTelemetryMiddleware(Middleware):
    """Export run and step spans through the OpenTelemetry SDK."""

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = trace.get_tracer("stepstone", tracer_provider=tracer_provider)

    def before_execution(self, ctx: Context) -> None:
        from opentelemetry import propagate

        carrier = json.loads(ctx.trace_context) if ctx.trace_context else {}
        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"stepstone.run {ctx.function_id}",
            context=parent,
            attributes={
                "stepstone.run_id": ctx.run_id,
                "stepstone.function_id": ctx.function_id,
                "stepstone.attempt": ctx.run_attempt,
                "stepstone.event": ctx.event.name,
            },
        )
        ctx.state["otel.run"] = span

    def before_step(self, ctx: Context, step_id: str) -> None:
        run = ctx.state.get("otel.run")
        parent = self._trace.set_span_in_context(run) if run is not None else None
        ctx.state[f"otel.step.{step_id}"] = self.tracer.start_span(
            f"stepstone.step {step_id}",
            context=parent,
            attributes={
                "stepstone.run_id": ctx.run_id,
                "stepstone.function_id": ctx.function_id,
                "stepstone.step_id": step_id,
                "stepstone.attempt": ctx.step_attempt(step_id),
            },
        )

    def after_step(self, ctx: Context, step_id: str, output: Any, error: BaseException | None) -> None:
        span = ctx.state.pop(f"otel.step.{step_id}", None)
        if span is None:
            return
        if error is not None:
            span.record_exception(error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)))
        span.end()

    def after_execution(self, ctx: Context) -> None:
        span = ctx.state.pop("otel.run", None)
        if span is not None:
            span.end()
