"""The ``stepstone`` group: every command registered in one place."""

from __future__ import annotations

import logging

import click

from stepstone.cli import (
    apps,
    check,
    event_log,
    events,
    init,
    inventory,
    prune,
    queue,
    runs,
    serve,
    stats,
    worker,
)


@click.group()
@click.option("--log-level", default="INFO", show_default=True)
def main(log_level: str) -> None:
    """Stepstone: durable functions on SQLite or PostgreSQL."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


for command in (
    worker.worker,
    worker.migrate,
    check.check,
    events.send,
    event_log.events,
    queue.queue,
    runs.runs,
    inventory.functions,
    inventory.workers,
    apps.apps,
    stats.stats,
    prune.prune,
    serve.server,
    serve.dev,
    init.init,
):
    main.add_command(command)
