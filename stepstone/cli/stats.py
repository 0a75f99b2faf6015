"""``stepstone stats``: rows and bytes per table and the oldest ended run, so an
operator sees the database grow before the disk fills (issue 17)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import click
from rich.table import Table

from stepstone.app import App
from stepstone.cli import render
from stepstone.cli.common import console, guard, open_target, target_options
from stepstone.client import Client
from stepstone.inventory import DatabaseStats, database_stats, human_bytes


@click.command()
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def stats(database_url: str | None, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Rows and bytes per table, the database's size and the oldest ended run."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            found = _read(target)
            if as_json:
                render.emit_json(asdict(found))
            else:
                _print(found)

        guard(show)


def _read(target: App | Client) -> DatabaseStats:
    return target.stats() if isinstance(target, Client) else target.store.read_sync(database_stats)


def _print(found: DatabaseStats) -> None:
    table = Table("table", "rows", "bytes", title="database size")
    for t in sorted(found.tables, key=lambda t: -(t.bytes or 0)):
        table.add_row(t.name, f"{t.rows:,}", human_bytes(t.bytes))
    table.add_row("[bold]total[/]", f"{sum(t.rows for t in found.tables):,}", human_bytes(found.total_bytes))
    console.print(table)
    run = found.oldest_ended
    if run is None:
        console.print("oldest ended run: none")
    else:
        ended = datetime.fromtimestamp(run.ended_at, UTC)
        when = f"{ended:%Y-%m-%d %H:%M:%S}Z"
        console.print(f"oldest ended run: {run.id} ({run.status}, ended {when})", highlight=False)
