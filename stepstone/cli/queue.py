"""``stepstone queue``: what is waiting, per function and concurrency key."""

from __future__ import annotations

import click

from stepstone.cli import render, views
from stepstone.cli.common import guard, open_target, target_options


@click.command()
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def queue(database_url: str | None, url: str | None, api_key: str | None, as_json: bool) -> None:
    """The queue's backlog per function and concurrency key: items due now and
    waiting for a worker, held by a worker, and in all (the rest are sleeping,
    waiting or backing off)."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            loads = views.loads(target)
            if as_json:
                render.emit_json(
                    [
                        {"function_id": load.function.id, "keys": [k.model_dump() for k in load.keys]}
                        for load in loads
                    ]
                )
            else:
                render.queue_table(loads)

        guard(show)
