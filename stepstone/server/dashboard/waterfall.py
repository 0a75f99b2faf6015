"""A run's trace laid out as a waterfall: one row per span (the run, its queue
delay, every step attempt, sleeps, waits, invokes, operator actions, warnings)
on one time axis from the run's creation to its end (or now).

Positions are in thousandths of the axis, drawn as SVG attributes (no inline
styles, so the page's Content-Security-Policy can forbid them).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from stepstone.encryption import mask
from stepstone.runs import Run, Span, StepRecord
from stepstone.store.rows import RunStatus, StepStatus

SCALE = 1000.0
MIN_WIDTH = 4.0  # an instant still shows as a sliver
TICKS = 5


@dataclass(frozen=True)
class Row:
    index: int
    span: Span
    x: float
    width: float
    tone: str  # css class: ok, failed, retrying, waiting, queued, warning, info
    label: str
    output: Any = None
    has_output: bool = False
    input: Any = None


@dataclass(frozen=True)
class Waterfall:
    start: datetime
    total: float  # seconds on the axis
    rows: list[Row]
    ticks: list[tuple[float, float]]  # (position 0..1000, seconds from start)


_TONES = {
    "completed": "ok",
    "ok": "ok",
    "done": "ok",
    "failed": "failed",
    "retrying": "retrying",
    "cancelled": "failed",
    "waiting": "waiting",
    "sleeping": "waiting",
    "running": "running",
    "queued": "queued",
    "warning": "warning",
    "skipped": "queued",
}


def _tone(span: Span) -> str:
    if span.kind == "warning":
        return "warning"
    if span.kind == "queued":
        return "queued"
    return _TONES.get(span.status, "info")


def _label(span: Span) -> str:
    if span.kind == "step" and span.attempt > 1:
        return f"{span.name} (attempt {span.attempt})"
    if span.kind == "queued":
        return "queue delay"
    return span.name


def _final_step(span: Span, steps: dict[str, StepRecord]) -> StepRecord | None:
    """The memo a span shows the output of: the step's latest state, not a retried attempt."""
    step = steps.get(span.name)
    if step is None or span.status == StepStatus.RETRYING or span.kind in ("run", "queued", "warning"):
        return None
    return step


def layout(run: Run, spans: list[Span], now: datetime, event_data: Any = None) -> Waterfall:
    start = run.created_at
    end = max([s.ended_at or now for s in spans] + [run.ended_at or now, start])
    total = max((end - start).total_seconds(), 0.001)
    steps = {s.id: s for s in run.steps}
    rows = []
    for index, span in enumerate(spans):
        offset = (span.started_at - start).total_seconds() / total * SCALE
        length = ((span.ended_at or now) - span.started_at).total_seconds() / total * SCALE
        x = min(max(offset, 0.0), SCALE - MIN_WIDTH)
        width = min(max(length, MIN_WIDTH), SCALE - x)
        step = _final_step(span, steps)
        is_run = span.kind == "run"
        rows.append(
            Row(
                index,
                span,
                round(x, 2),
                round(width, 2),
                _tone(span),
                _label(span),
                output=mask(run.output) if is_run else (mask(step.output) if step else None),
                has_output=(is_run and run.status == RunStatus.COMPLETED)
                or (step is not None and step.status == StepStatus.COMPLETED),
                input=mask(event_data) if is_run else None,
            )
        )
    ticks = [(SCALE * i / (TICKS - 1), total * i / (TICKS - 1)) for i in range(TICKS)]
    return Waterfall(start, total, rows, ticks)
