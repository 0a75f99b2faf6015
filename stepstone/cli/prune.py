"""``stepstone prune --older-than 30d [--dry-run]``: retention on demand, in the
same small batches as the workers' periodic duties, with a progress bar."""

from __future__ import annotations

import contextlib

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stepstone import metrics
from stepstone.app import App
from stepstone.cli.common import console, errors, guard, resolve_url
from stepstone.durations import parse_duration
from stepstone.errors import ConfigError
from stepstone.scheduler.retention import RUN_BATCH, count_prunable_op, pace_for, prune_plan, run_plan
from stepstone.store.viewrows import Pruned


@click.command()
@click.option("--older-than", default="30d", show_default=True, help="Delete runs that ended longer ago.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--batch", default=RUN_BATCH, show_default=True, help="Runs per transaction, at most.")
@click.option("--database-url", default=None, help="Default: $STEPSTONE_DATABASE_URL or local SQLite.")
def prune(older_than: str, dry_run: bool, batch: int, database_url: str | None) -> None:
    """Delete ended runs older than --older-than (with their steps, spans and the
    events no other run needs), expired dedupe keys, idle rate-limit cells and
    unused wait keys. Live runs, and runs a live run invoked, are kept."""
    try:
        retention = parse_duration(older_than, field="older-than")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from exc
    if batch < 1:
        raise click.BadParameter("must be at least 1", param_hint="--batch")
    with contextlib.closing(App("cli", database_url=resolve_url(database_url))) as app:
        guard(lambda: _prune(app, retention, dry_run, batch))


def _prune(app: App, retention: float, dry_run: bool, batch: int) -> None:
    now = app.clock.now()
    store = app.store
    counts = store.read_sync(count_prunable_op(retention, now))
    runs = counts["runs"]
    if dry_run:
        console.print(f"would delete {runs} run(s) that ended before the cutoff (dry run), and now:")
        for table, n in counts.items():
            if table != "runs":
                console.print(f"  {table}: {n}", highlight=False)
        return
    columns = (TextColumn("pruning runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=errors) as bar:
        task = bar.add_task("prune", total=runs)

        def advance(pruned: Pruned) -> None:
            metrics.pruned(pruned.counts)
            bar.advance(task, pruned.counts.get("runs", 0))

        pace = pace_for(store.dialect, runs=batch)
        total = run_plan(prune_plan(retention, now, pace), store.transact_sync, advance, pace)
    deleted = ", ".join(f"{n} {table}" for table, n in sorted(total.counts.items()) if n) or "nothing"
    console.print(f"deleted {deleted}", highlight=False)
