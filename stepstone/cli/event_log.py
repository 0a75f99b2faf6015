"""``stepstone events list``: the event log, newest first, with the runs each
event started."""

from __future__ import annotations

import click

from stepstone.cli import render, views
from stepstone.cli.common import guard, open_target, target_options


@click.group()
def events() -> None:
    """Read the event log."""


@events.command("list")
@click.option("--name", default=None, help="Only events with this name.")
@click.option("--id", "event_id", default=None, help="Only the event with this id.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 500))
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def events_list(
    name: str | None,
    event_id: str | None,
    limit: int,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Events, newest first, each with the runs it started."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            found = views.events(target, name, event_id, limit)
            if as_json:
                render.emit_json([e.model_dump(mode="json") for e in found])
            else:
                render.events_table(found)

        guard(show)
