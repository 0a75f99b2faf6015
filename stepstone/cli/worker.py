"""``stepstone worker`` and ``stepstone migrate``."""

from __future__ import annotations

import asyncio
import gc
import signal

import click

from stepstone import metrics
from stepstone.app import App
from stepstone.attempts import DEFAULT_MAX_ABANDONED
from stepstone.cli.common import console, load_app, redacted, resolve_url
from stepstone.store import make_store
from stepstone.worker import Worker


@click.command()
@click.argument("target")
@click.option("--concurrency", default=10, show_default=True, help="Runs executed at once.")
@click.option("--instance-id", default=None, help="Worker name (default: host-pid).")
@click.option(
    "--lease-ttl", default=15.0, show_default=True, help="Seconds before a dead worker's runs move on."
)
@click.option("--drain-timeout", default=30.0, show_default=True, help="Seconds to finish steps on SIGTERM.")
@click.option(
    "--metrics-port", type=int, default=None, help="Serve /metrics, /healthz and /readyz on 127.0.0.1:PORT."
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option(
    "--max-abandoned-threads",
    default=DEFAULT_MAX_ABANDONED,
    show_default=True,
    help="Sync steps abandoned past their timeout still running before the worker stops leasing.",
)
def worker(
    target: str,
    concurrency: int,
    instance_id: str | None,
    lease_ttl: float,
    drain_timeout: float,
    metrics_port: int | None,
    metrics_host: str,
    max_abandoned_threads: int,
) -> None:
    """Run a long-lived worker for MODULE:app until SIGTERM or SIGINT."""
    app = load_app(target)
    started: list[Worker] = []
    if metrics_port is not None:
        metrics.serve(
            metrics_host,
            metrics_port,
            lambda: started[0].health() if started else {"ready": False, "starting": True},
        )
    asyncio.run(
        _run_worker(app, concurrency, instance_id, lease_ttl, drain_timeout, max_abandoned_threads, started)
    )


async def _run_worker(
    app: App,
    concurrency: int,
    instance_id: str | None,
    lease_ttl: float,
    drain_timeout: float,
    max_abandoned_threads: int,
    started: list[Worker],
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    w = await app.start_async(
        concurrency=concurrency,
        instance_id=instance_id,
        lease_ttl=lease_ttl,
        max_abandoned_threads=max_abandoned_threads,
    )
    started.append(w)
    _settle_heap()
    console.print(
        f"[green]worker {w.id}[/] running {len(app.registry.ids())} function(s) "
        f"on {redacted(app.database_url)}",
        highlight=False,
    )
    await stop.wait()
    console.print(f"worker {w.id}: draining (up to {drain_timeout:g}s)", highlight=False)
    await app.stop_async(drain_timeout)
    console.print(f"worker {w.id}: stopped", highlight=False)


# Young objects collected together (CPython's default: 700): a worker holds each
# in-flight run's objects (~70 gc-tracked ones a run, 10 runs at once) through
# its few commits, so at 700 nearly every collection finds them alive and moves
# them up a generation, to be scanned again there before they die.
YOUNG_COLLECTED = 7000


def _settle_heap() -> None:
    """Once the worker has started: what start-up built (modules, the app, its
    functions) is never garbage, so it is frozen out of the collector's full
    scans (``gc.freeze``, after one collection: nothing collectable is
    frozen), and the youngest generation is collected less often
    (``YOUNG_COLLECTED``). Measured on a queued SQLite drain (a finished
    run's objects freed as it ends, none left in cycles), the collector's CPU
    per run fell from ~16 µs to under 1 (docs/benchmarks.md, issue 18,
    session 8). The worker command owns its process: an app started in
    someone else's process leaves that process's collector alone."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTED, older, oldest)


@click.command()
@click.option(
    "--database-url", default=None, help="Default: $STEPSTONE_DATABASE_URL or the local SQLite file."
)
def migrate(database_url: str | None) -> None:
    """Apply pending schema migrations."""
    store = make_store(resolve_url(database_url))
    try:
        applied = store.migrate()
    finally:
        store.close()
    console.print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'up to date'}")
