"""Per-step overhead of a run pushed to an HTTP endpoint (``ss.serve`` under
uvicorn, another process, real loopback HTTP) against the same handler
executed by an in-process worker, in the same run.

    .venv/bin/python bench/bench_push.py [--samples 40] [--steps 10]

One run at a time, kinds alternating: a run's time is from its creation (the
event's commit) to its end, as the database recorded them. The handler runs ``--steps``
no-op async steps. Both sides use one SQLite database; the pushed side is the
server's ``Pusher`` (a worker per served app whose invocation is one signed
POST), hosted by this process as ``stepstone server`` hosts it. Also printed:
the requests each pushed run took (one per invocation, not per step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from push_app import steps
from workloads import pct

import stepstone as ss
from stepstone.introspection import AppDocument
from stepstone.pusher import Pusher, PushSettings
from stepstone.signing import SIGNATURE_HEADER, SigningKeys, sign

KEY = "bench-signing-key-" + "b" * 16
KINDS = ("worker", "pushed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_endpoint(port: int, n_steps: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ENDPOINT_KEY": KEY, "STEPS": str(n_steps), "PYTHONPATH": str(Path(__file__).parent)}
    args = [sys.executable, "-m", "uvicorn", "push_app:asgi", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(args, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 401:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the endpoint did not start")
        time.sleep(0.05)


def register(app: ss.App, url: str) -> None:
    """What ``stepstone apps sync URL`` does: the signed document into the catalog."""
    keys = SigningKeys.of(KEY)
    answer = httpx.get(url, headers={SIGNATURE_HEADER: sign(b"", keys)}, timeout=10)
    doc = AppDocument.from_json(answer.json())
    configs = {f["id"]: json.dumps({**f, "serve_url": url}) for f in doc.functions}
    app.store.transact_sync(lambda tx: tx.register_functions(doc.app, configs, time.time()))
    app.catalog.invalidate()


async def one(app: ss.App, kind: str) -> float:
    """From the event's commit to the run's end, as the database recorded them
    (``app.runs.wait``'s polling is not counted)."""
    [event_id] = await app.send_async(ss.Event(f"bench.{kind}", {}))
    [run] = await app.runs.list_async(event_id=event_id)
    done = await app.runs.wait_async(run.id, timeout="60s")
    assert done.status == "completed" and done.ended_at is not None, done.error
    return (done.ended_at - done.created_at).total_seconds()


async def measure(url: str, endpoint: str, samples: int) -> tuple[dict[str, list[float]], float]:
    app = ss.App("bench-push", database_url=url)
    app.function(id="worker-steps", trigger=ss.on_event("bench.worker"))(steps)
    register(app, endpoint)
    pusher = Pusher(
        store=app.store,
        clock=app.clock,
        catalog=lambda: app.catalog.registry(app.store),
        keys=SigningKeys.of(KEY),
        settings=PushSettings(refresh=0.1),
    )
    await app.start_async()
    await pusher.start()  # serves the registered app at once
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        for kind in KINDS:  # warm up both paths
            await one(app, kind)
        before = next(iter(pusher.workers.values()))[0].invocations
        for i in range(samples):
            for kind in KINDS if i % 2 == 0 else reversed(KINDS):
                times[kind].append(await one(app, kind))
        requests = (next(iter(pusher.workers.values()))[0].invocations - before) / samples
    finally:
        await pusher.stop()
        await app.stop_async()
        app.close()
    return times, requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    port = free_port()
    proc = start_endpoint(port, args.steps)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            times, requests = asyncio.run(
                measure(f"sqlite:///{tmp}/push.db", f"http://127.0.0.1:{port}/", args.samples)
            )
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{args.steps} no-op steps per run, {args.samples} runs of each kind, one at a time (SQLite)")
    print(f"{'kind':8} {'p50 run ms':>11} {'p90 run ms':>11} {'p50 ms/step':>12}")
    for kind in KINDS:
        p50, p90 = pct(times[kind], 0.5) * 1000, pct(times[kind], 0.9) * 1000
        print(f"{kind:8} {p50:11.1f} {p90:11.1f} {p50 / args.steps:12.2f}")
    ratio = pct(times["pushed"], 0.5) / pct(times["worker"], 0.5)
    print(f"pushed / worker (p50 run): {ratio:.2f}x; requests per pushed run: {requests:.2f}")


if __name__ == "__main__":
    main()
