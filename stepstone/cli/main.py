"""The ``stepstone`` group: every command registered in one place."""

from __future__ import annotations

import logging

import click

from stepstone.cli import events, inventory, prune, runs, serve, stats, worker


@click.group()
@click.option("--log-level", default="INFO", show_default=True)
def main(log_level: str) -> None:
    """Stepstone: durable functions on SQLite or PostgreSQL."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")


for command in (
    worker.worker,
    worker.migrate,
    events.send,
    runs.runs,
    inventory.functions,
    inventory.workers,
    stats.stats,
    prune.prune,
    serve.server,
    serve.dev,
):
    main.add_command(command)
