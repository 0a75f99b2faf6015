"""``stepstone functions`` and ``stepstone workers``."""

from __future__ import annotations

import click

from stepstone.cli import render
from stepstone.cli.common import guard, open_target, target_options
from stepstone.client import Client
from stepstone.inventory import list_functions


@click.command()
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def functions(database_url: str | None, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Functions registered in the database, with triggers and flow control."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            if isinstance(target, Client):
                found = target.functions.list()
            else:
                found = target.store.read_sync(list_functions)
            if as_json:
                render.emit_json(render.functions_json(found))
            else:
                render.functions_table(found)

        guard(show)


@click.command()
@target_options
@click.option("--alive-within", default=60.0, show_default=True, help="Seconds since the last heartbeat.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def workers(
    database_url: str | None, url: str | None, api_key: str | None, alive_within: float, as_json: bool
) -> None:
    """Live workers."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            found = target.workers.list(alive_within)
            if as_json:
                render.emit_json(render.workers_json(found))
            else:
                render.workers_table(found)

        guard(show)
