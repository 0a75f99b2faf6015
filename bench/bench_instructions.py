"""Machine instructions per run on SQLite, counted under valgrind (issue 18,
session 7): a load-independent measure of the engine's cost per run.

    .venv/bin/python bench/bench_instructions.py [--runs 400] [--mode queued|sequential|both]
    .venv/bin/python bench/bench_instructions.py --store postgres [--database-url URL]  # sequential
    PYTHONPATH=<tree>:<tree>/bench .venv/bin/python bench/bench_instructions.py   # another tree

Each mode runs twice under ``valgrind --tool=cachegrind --cache-sim=no``, once
with no measured runs and once with ``--runs``: the difference over the runs is
the instructions one run costs (start-up, imports, warm-up and the worker's
start cancel out). Queued: the runs are sent in one batch to a running
in-process worker (concurrency 10) and drained; sequential: send,
``runs.list(event_id=)``, ``runs.wait``, one run at a time; worker (session
8): runs queued first, then drained by a process that only works them, as
``stepstone worker`` does (compare.py's queued figure), the sending not
counted. All at
``synchronous=normal`` (an fsync costs time, not instructions). ``--store
postgres`` counts the sequential mode's client (this process; the server is
another) on a private cluster, or on a database created on ``--database-url``. Repeated, the
queued figure agrees within ~0.1 %, the sequential one within ~1 % (its idle
polls scale with valgrind's slow-down). ``--child`` is the measured process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from workloads import add_three_steps

import stepstone as ss

WARM_UP = 20


async def _queued(folder: str, runs: int) -> None:
    app = ss.App("count", database_url=f"sqlite:///{folder}/count.db?synchronous=normal")
    add_three_steps(app)
    ended = 0
    warm, done = asyncio.Event(), asyncio.Event()

    def on_end(run_id: str, _read: object = None) -> None:
        nonlocal ended
        ended += 1
        if ended == WARM_UP:
            warm.set()
        if ended == WARM_UP + runs:
            done.set()

    app._run_changed = on_end  # type: ignore[method-assign]
    await app.send_async([ss.Event("three") for _ in range(WARM_UP)])
    await app.start_async(concurrency=10)
    await asyncio.wait_for(warm.wait(), 3600)
    if runs:
        await app.send_async([ss.Event("three") for _ in range(runs)])
    await asyncio.wait_for(done.wait(), 3600)
    await app.stop_async()
    app.close()


async def _sequential(folder: str, runs: int) -> None:
    """``folder``: SQLite's, or a PostgreSQL database's URL (``--store postgres``)."""
    url = folder if folder.startswith("postgresql") else _url(folder)
    app = ss.App("count", database_url=url)
    add_three_steps(app)
    await app.start_async(concurrency=10)
    for _ in range(WARM_UP + runs):
        [eid] = await app.send_async(ss.Event("three"))
        [run] = await app.runs.list_async(event_id=eid)
        await app.runs.wait_async(run.id, timeout="600s")
    await app.stop_async()
    app.close()


async def _worker(folder: str, runs: int) -> None:
    """A worker process draining runs queued before it started, as ``stepstone
    worker`` runs one (its heap settled once started: ``cli/worker.py``)."""
    app = ss.App("count", database_url=_url(folder))
    add_three_steps(app)
    ended = 0
    done = asyncio.Event()

    def on_end(run_id: str, _read: object = None) -> None:
        nonlocal ended
        ended += 1
        if ended == WARM_UP + runs:
            done.set()

    app._run_changed = on_end  # type: ignore[method-assign]
    await app.start_async(concurrency=10)
    from stepstone.cli import worker as command  # here: the other modes never import the CLI

    settle = getattr(command, "_settle_heap", None)  # absent in older trees
    if settle is not None:
        settle()
    await asyncio.wait_for(done.wait(), 3600)
    await app.stop_async()
    app.close()


def _url(folder: str) -> str:
    return f"sqlite:///{folder}/count.db?synchronous=normal"


def _queue(folder: str, runs: int) -> None:
    """``WARM_UP + runs`` three-step runs queued with no worker running."""
    sender = ss.App("sender", database_url=_url(folder))
    sender.function(id="three", trigger=ss.on_event("three"))(lambda ctx: None)  # the trigger only
    for start in range(0, WARM_UP + runs, 500):
        sender.send([ss.Event("three") for _ in range(min(500, WARM_UP + runs - start))])
    sender.close()


def _instructions(mode: str, runs: int, database: Callable[[str], str] | None = None) -> int:
    if database is not None:  # PostgreSQL: a fresh database per process
        return _counted(mode, runs, database(f"{mode}_{runs}"))
    with tempfile.TemporaryDirectory() as folder:
        if mode == "worker":
            _queue(folder, runs)
        return _counted(mode, runs, folder)


def _counted(mode: str, runs: int, folder: str) -> int:
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--mode",
        mode,
        "--runs",
        str(runs),
        "--folder",
        folder,
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ.copy())
    match = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--mode", choices=["queued", "sequential", "worker", "both"], default="both")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--database-url", help="with --store postgres: a server to create databases on")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # the child's database folder
    args = parser.parse_args()
    if args.child:
        work = {"queued": _queued, "sequential": _sequential, "worker": _worker}[args.mode]
        asyncio.run(work(args.folder, args.runs))
        return 0
    print(f"stepstone from {Path(ss.__file__).resolve().parent}")
    modes = ["queued", "sequential"] if args.mode == "both" else [args.mode]
    if args.store == "postgres":  # the client's instructions only (the server is another process)
        from bench_postgres import server

        with server(args.database_url) as create:
            _report(["sequential"], args.runs, create)
        return 0
    _report(modes, args.runs)
    return 0


def _report(modes: list[str], runs: int, database: Callable[[str], str] | None = None) -> None:
    for mode in modes:
        base, measured = _instructions(mode, 0, database), _instructions(mode, runs, database)
        print(f"  {mode:10} {(measured - base) / runs / 1e6:.3f} M instructions per run ({runs} runs)")


if __name__ == "__main__":
    sys.exit(main())
