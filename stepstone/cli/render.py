"""How the CLI shows things: rich tables for people, JSON (``--json``) for programs."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import click
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from stepstone.cli.common import console, errors
from stepstone.errors import ErrorInfo
from stepstone.inventory import FunctionInfo
from stepstone.runs import Run, Span
from stepstone.store.rows import WorkerRow


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _error(error: ErrorInfo | None) -> dict[str, Any] | None:
    return error.to_json() if error else None


def run_json(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "function_id": run.function_id,
        "status": run.status,
        "output": run.output,
        "error": _error(run.error),
        "event_ids": run.event_ids,
        "created_at": run.created_at.isoformat(),
        "started_at": _iso(run.started_at),
        "ended_at": _iso(run.ended_at),
        "app_version": run.app_version,
        "steps": [
            {
                "id": s.id,
                "status": s.status,
                "attempts": s.attempts,
                "output": s.output,
                "error": _error(s.error),
            }
            for s in run.steps
        ],
    }


def span_json(span: Span) -> dict[str, Any]:
    return {
        "kind": span.kind,
        "name": span.name,
        "status": span.status,
        "attempt": span.attempt,
        "started_at": span.started_at.isoformat(),
        "ended_at": _iso(span.ended_at),
        "duration": span.duration,
        "error": _error(span.error),
        "detail": span.detail,
    }


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def runs_table(runs: Sequence[Run]) -> None:
    table = Table(Column("run", no_wrap=True), "function", "status", "version", "created", "ended")
    for r in runs:
        table.add_row(
            r.id,
            r.function_id,
            r.status,
            r.app_version or "-",
            f"{r.created_at:%Y-%m-%d %H:%M:%S}",
            f"{r.ended_at:%H:%M:%S}" if r.ended_at else "",
        )
    console.print(table)


def run_details(run: Run) -> None:
    console.print(f"run {run.id} [bold]{run.status}[/] function {run.function_id}", highlight=False)
    if run.error:
        console.print(f"error: {run.error.type}: {run.error.message}", highlight=False)
    table = Table("step", "status", "attempts", "output / error")
    for s in run.steps:
        detail = f"{s.error.type}: {s.error.message}" if s.error else json.dumps(s.output)
        table.add_row(s.id, s.status, str(s.attempts), detail[:80])
    console.print(table)


def spans_table(spans: Sequence[Span]) -> None:
    table = Table("kind", "name", "status", "attempt", "started", "duration", "error / detail")
    for s in spans:
        note = f"{s.error.type}: {s.error.message}" if s.error else str(s.detail or "")
        duration = "" if s.duration is None else f"{s.duration * 1000:.1f} ms"
        table.add_row(
            s.kind, s.name, s.status, str(s.attempt), f"{s.started_at:%H:%M:%S.%f}"[:-3], duration, note[:80]
        )
    console.print(table)


def functions_table(functions: Sequence[FunctionInfo]) -> None:
    table = Table("function", "app", "triggers", "retries", "flow control", "retired")
    for f in functions:
        triggers = ", ".join(_trigger(t) for t in f.triggers) or "-"
        flow = ", ".join(sorted(k for k, v in f.config.items() if v is not None)) or "-"
        retired = "-"
        if f.retired_at is not None:
            retired = f"{datetime.fromtimestamp(f.retired_at, UTC):%Y-%m-%d %H:%M}Z"
        table.add_row(f.id, f.app, triggers, str(f.retries), flow, retired)
    console.print(table)


def _trigger(raw: dict[str, Any]) -> str:
    if raw.get("cron"):
        return f"cron {raw['cron']}"
    return str(raw.get("event")) + (f" if {raw['if']}" if raw.get("if") else "")


def functions_json(functions: Sequence[FunctionInfo]) -> list[dict[str, Any]]:
    return [asdict(f) for f in functions]


def workers_table(workers: Sequence[WorkerRow]) -> None:
    now = datetime.now(UTC).timestamp()
    table = Table("worker", "app", "version", "concurrency", "heartbeat", "functions")
    for w in workers:
        table.add_row(
            w.id,
            w.app,
            w.app_version or "-",
            str(w.concurrency),
            f"{max(0.0, now - w.heartbeat_at):.1f}s ago",
            str(len(w.functions)),
        )
    console.print(table)


def workers_json(workers: Sequence[WorkerRow]) -> list[dict[str, Any]]:
    return [asdict(w) for w in workers]


@contextmanager
def bulk_progress(label: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr (none with ``quiet``); yields the ``progress`` callback."""
    if quiet:
        yield lambda done, examined: None
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[done]} done / {task.completed:.0f} examined"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=errors, transient=False) as bar:
        task = bar.add_task(label, total=None, done=0)

        def report(done: int, examined: int) -> None:
            bar.update(task, completed=examined, done=done)

        yield report
        bar.update(task, total=max(1, bar.tasks[0].completed))
