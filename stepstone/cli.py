"""The ``stepstone`` command line."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console
from rich.table import Table

from stepstone.app import DEFAULT_DATABASE_URL, App
from stepstone.errors import StepstoneError
from stepstone.events import Event
from stepstone.store.base import make_store

console = Console()


def load_app(target: str) -> App:
    """Import ``MODULE:attr`` (the current directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise click.BadParameter(f"expected MODULE:app, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{target!r} is not a stepstone.App")
    return app


@click.group()
@click.option("--log-level", default="INFO", show_default=True)
def main(log_level: str) -> None:
    """Stepstone: durable functions on SQLite or PostgreSQL."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")


@main.command()
@click.argument("target")
@click.option("--concurrency", default=10, show_default=True, help="Runs executed at once.")
@click.option("--instance-id", default=None, help="Worker name (default: host-pid).")
@click.option("--lease-ttl", default=15.0, show_default=True,
              help="Seconds before a dead worker's runs move on.")
@click.option("--drain-timeout", default=30.0, show_default=True, help="Seconds to finish steps on SIGTERM.")
def worker(target: str, concurrency: int, instance_id: str | None, lease_ttl: float,
           drain_timeout: float) -> None:
    """Run a long-lived worker for MODULE:app until SIGTERM or SIGINT."""
    app = load_app(target)
    asyncio.run(_run_worker(app, concurrency, instance_id, lease_ttl, drain_timeout))


async def _run_worker(app: App, concurrency: int, instance_id: str | None, lease_ttl: float,
                      drain_timeout: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    w = await app.start_async(concurrency=concurrency, instance_id=instance_id, lease_ttl=lease_ttl)
    console.print(f"[green]worker {w.id}[/] running {len(app.registry.ids())} function(s) "
                  f"on {_redacted(app.database_url)}", highlight=False)
    await stop.wait()
    console.print(f"worker {w.id}: draining (up to {drain_timeout:g}s)", highlight=False)
    await app.stop_async(drain_timeout)
    console.print(f"worker {w.id}: stopped", highlight=False)


def _redacted(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _database_url(url: str | None) -> str:
    return url or os.environ.get("STEPSTONE_DATABASE_URL") or DEFAULT_DATABASE_URL


@main.command()
@click.option("--database-url", default=None,
              help="Default: $STEPSTONE_DATABASE_URL or the local SQLite file.")
def migrate(database_url: str | None) -> None:
    """Apply pending schema migrations."""
    store = make_store(_database_url(database_url))
    try:
        applied = store.migrate()
    finally:
        store.close()
    console.print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'up to date'}")


@main.command()
@click.argument("name")
@click.option("--data", default="{}", help="Event data as a JSON object.")
@click.option("--id", "event_id", default=None, help="Event id (dedupes for 24 h).")
@click.option("--database-url", default=None)
def send(name: str, data: str, event_id: str | None, database_url: str | None) -> None:
    """Send an event NAME with --data JSON."""
    try:
        payload = json.loads(data)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--data is not JSON: {exc}") from exc
    app = App("cli", database_url=_database_url(database_url))
    _guard(lambda: click.echo(json.dumps(app.send(Event(name, payload, event_id)))))


def _guard(action: Any) -> None:
    try:
        action()
    except StepstoneError as exc:
        raise click.ClickException(str(exc)) from exc


@main.group()
def runs() -> None:
    """List, inspect, cancel and replay runs."""


@runs.command("list")
@click.option("--function", "function_id", default=None)
@click.option("--status", default=None)
@click.option("--limit", default=20, show_default=True)
@click.option("--database-url", default=None)
@click.option("--json", "as_json", is_flag=True)
def runs_list(function_id: str | None, status: str | None, limit: int, database_url: str | None,
              as_json: bool) -> None:
    app = App("cli", database_url=_database_url(database_url))

    def show() -> None:
        found = app.runs.list(function_id=function_id, status=status, limit=limit)
        if as_json:
            click.echo(json.dumps([_run_json(r) for r in found], indent=2))
            return
        table = Table("run", "function", "status", "created", "ended")
        for r in found:
            table.add_row(r.id, r.function_id, r.status, f"{r.created_at:%Y-%m-%d %H:%M:%S}",
                          f"{r.ended_at:%H:%M:%S}" if r.ended_at else "")
        console.print(table)

    _guard(show)


def _run_json(run: Any) -> dict[str, Any]:
    return {
        "id": run.id, "function_id": run.function_id, "status": run.status, "output": run.output,
        "error": run.error.to_json() if run.error else None, "event_ids": run.event_ids,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "ended_at": run.ended_at.isoformat() if run.ended_at else None,
        "steps": [{"id": s.id, "status": s.status, "attempts": s.attempts, "output": s.output,
                   "error": s.error.to_json() if s.error else None} for s in run.steps],
    }


@runs.command("show")
@click.argument("run_id")
@click.option("--database-url", default=None)
@click.option("--json", "as_json", is_flag=True)
def runs_show(run_id: str, database_url: str | None, as_json: bool) -> None:
    app = App("cli", database_url=_database_url(database_url))

    def show() -> None:
        run = app.runs.get(run_id)
        if as_json:
            click.echo(json.dumps(_run_json(run), indent=2))
            return
        console.print(f"run {run.id} [bold]{run.status}[/] function {run.function_id}", highlight=False)
        if run.error:
            console.print(f"error: {run.error.type}: {run.error.message}", highlight=False)
        table = Table("step", "status", "attempts", "output / error")
        for s in run.steps:
            detail = f"{s.error.type}: {s.error.message}" if s.error else json.dumps(s.output)
            table.add_row(s.id, s.status, str(s.attempts), detail[:80])
        console.print(table)

    _guard(show)


@runs.command("cancel")
@click.argument("run_id")
@click.option("--database-url", default=None)
def runs_cancel(run_id: str, database_url: str | None) -> None:
    app = App("cli", database_url=_database_url(database_url))
    _guard(lambda: click.echo(app.runs.cancel(run_id)))


@runs.command("replay")
@click.argument("run_id")
@click.option("--database-url", default=None)
def runs_replay(run_id: str, database_url: str | None) -> None:
    app = App("cli", database_url=_database_url(database_url))

    def replay() -> None:
        app.runs.replay(run_id)
        click.echo(f"replaying {run_id}")

    _guard(replay)


if __name__ == "__main__":  # pragma: no cover
    main()
