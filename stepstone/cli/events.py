"""``stepstone send``."""

from __future__ import annotations

import json

import click

from stepstone.cli.common import guard, open_target, parse_json, target_options
from stepstone.events import Event


@click.command()
@click.argument("name")
@click.option("--data", default="{}", help="Event data as a JSON object.")
@click.option("--id", "event_id", default=None, help="Event id (dedupes for 24 h).")
@target_options
@click.option(
    "--event-key",
    envvar="STEPSTONE_EVENT_KEY",
    default=None,
    help="With --url: the server's event key ($STEPSTONE_EVENT_KEY).",
)
def send(
    name: str,
    data: str,
    event_id: str | None,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
    event_key: str | None,
) -> None:
    """Send an event NAME with --data JSON; prints the event ids as JSON."""
    payload = parse_json(data)
    with open_target(database_url, url, api_key, event_key) as target:
        guard(lambda: click.echo(json.dumps(target.send(Event(name, payload, event_id)))))
