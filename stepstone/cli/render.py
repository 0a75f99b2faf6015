"""How the CLI shows things: rich tables for people, JSON (``--json``) for programs.

Tables never cut an id (run, event, worker, function ids are whole on one line,
ready to paste into the next command); other columns wrap when the terminal is
narrow."""

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
from stepstone.server.view_schemas import EventOut, FunctionLoadOut, KeyBacklogOut
from stepstone.store.viewrows import AppRow, WorkerRow

Row = Sequence[str]


def _print(headers: Sequence[str], rows: Sequence[Row], ids: Sequence[int] = (0,)) -> None:
    """A table whose ``ids`` columns never wrap nor shrink below their longest cell."""
    columns = []
    for index, header in enumerate(headers):
        if index in ids:
            widest = max([len(header), *(len(row[index]) for row in rows)])
            columns.append(Column(header, no_wrap=True, min_width=widest))
        else:
            columns.append(Column(header, overflow="fold"))
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    console.print(table)


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
    rows = [
        (
            r.id,
            r.function_id,
            r.status,
            r.app_version or "-",
            f"{r.created_at:%Y-%m-%d %H:%M:%S}",
            f"{r.ended_at:%H:%M:%S}" if r.ended_at else "",
        )
        for r in runs
    ]
    _print(("run", "function", "status", "version", "created", "ended"), rows, ids=(0, 1))


def run_details(run: Run) -> None:
    console.print(f"run {run.id} [bold]{run.status}[/] function {run.function_id}", highlight=False)
    if run.error:
        console.print(f"error: {run.error.type}: {run.error.message}", highlight=False)
    rows = [
        (
            s.id,
            s.status,
            str(s.attempts),
            f"{s.error.type}: {s.error.message}" if s.error else json.dumps(s.output),
        )
        for s in run.steps
    ]
    _print(("step", "status", "attempts", "output / error"), rows)


def spans_table(spans: Sequence[Span]) -> None:
    rows = []
    for s in spans:
        note = f"{s.error.type}: {s.error.message}" if s.error else str(s.detail or "")
        duration = "" if s.duration is None else f"{s.duration * 1000:.1f} ms"
        rows.append(
            (s.kind, s.name, s.status, str(s.attempt), f"{s.started_at:%H:%M:%S.%f}"[:-3], duration, note)
        )
    _print(("kind", "name", "status", "attempt", "started", "duration", "error / detail"), rows, ids=(1,))


def functions_table(functions: Sequence[FunctionInfo]) -> None:
    rows = []
    for f in functions:
        triggers = ", ".join(_trigger(t) for t in f.triggers) or "-"
        flow = ", ".join(sorted(k for k, v in f.config.items() if v is not None)) or "-"
        retired = "-"
        if f.retired_at is not None:
            retired = f"{datetime.fromtimestamp(f.retired_at, UTC):%Y-%m-%d %H:%M}Z"
        rows.append((f.id, f.app, triggers, str(f.retries), flow, retired))
    _print(("function", "app", "triggers", "retries", "flow control", "retired"), rows)


def _trigger(raw: dict[str, Any]) -> str:
    if raw.get("cron"):
        return f"cron {raw['cron']}"
    return str(raw.get("event")) + (f" if {raw['if']}" if raw.get("if") else "")


def functions_json(functions: Sequence[FunctionInfo]) -> list[dict[str, Any]]:
    return [asdict(f) for f in functions]


def workers_table(workers: Sequence[WorkerRow]) -> None:
    now = datetime.now(UTC).timestamp()
    rows = [
        (
            w.id,
            w.app,
            w.app_version or "-",
            str(w.concurrency),
            f"{max(0.0, now - w.heartbeat_at):.1f}s ago",
            str(len(w.functions)),
        )
        for w in workers
    ]
    _print(("worker", "app", "version", "concurrency", "heartbeat", "functions"), rows)


def _utc_minute(ts: float) -> str:
    return f"{datetime.fromtimestamp(ts, UTC):%Y-%m-%d %H:%M:%S}Z"


def apps_table(apps: Sequence[AppRow]) -> None:
    rows = [
        (
            a.url,
            a.app,
            a.app_version or "-",
            ", ".join(a.function_ids) or "-",
            _utc_minute(a.synced_at),
            "-" if a.error is None or a.error_at is None else f"{_utc_minute(a.error_at)}: {a.error}",
        )
        for a in apps
    ]
    _print(("url", "app", "version", "functions", "last sync", "error"), rows)


def apps_json(apps: Sequence[AppRow]) -> list[dict[str, Any]]:
    return [asdict(a) for a in apps]


def workers_json(workers: Sequence[WorkerRow]) -> list[dict[str, Any]]:
    return [asdict(w) for w in workers]


def events_table(events: Sequence[EventOut]) -> None:
    rows = [
        (
            e.id,
            e.name,
            f"{e.received_at:%Y-%m-%d %H:%M:%S}",
            " ".join(f"{r.id} ({r.function_id}, {r.status})" for r in e.runs) or "-",
            json.dumps(e.data),
        )
        for e in events
    ]
    _print(("event", "name", "received", "runs", "data"), rows)


def queue_table(loads: Sequence[FunctionLoadOut]) -> None:
    """One row per function and concurrency key values with queue items."""
    rows = [
        (load.function.id, _key(k), str(k.due), str(k.leased), str(k.total))
        for load in loads
        for k in load.keys
    ]
    if not rows:
        console.print("The queue is empty.")
        return
    _print(("function", "key", "due", "leased", "total"), rows)


def _key(backlog: KeyBacklogOut) -> str:
    pairs = ((backlog.ckey1, backlog.limit1), (backlog.ckey2, backlog.limit2))
    shown = [f"{value} (limit {limit})" for value, limit in pairs if value is not None or limit is not None]
    return " / ".join(shown) or "-"


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
