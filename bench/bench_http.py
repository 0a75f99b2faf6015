"""Event ingestion over HTTP (issue 6), next to in-process ``app.send`` measured in
the same run on the same kind of database.

    .venv/bin/python bench/bench_http.py            # default durability (synchronous=full)
    .venv/bin/python bench/bench_http.py --sync normal

The server is a real ``stepstone server`` process (no access log) on loopback;
the client keeps its connections alive. Every event triggers one function, so
each accepted event also creates a run and its queue item (no workers run, so
only ingestion is measured). Rows:

- in-process sequential: ``app.send(event)`` one at a time;
- in-process concurrent: 16 tasks calling ``await app.send_async(event)``
  (group commit shares transactions);
- HTTP sequential: one ``POST /api/v1/events`` at a time on one connection;
- HTTP batches: 100 events per request, sequential;
- HTTP concurrent: 16 requests in flight on 16 kept-alive connections;
- HTTP sequential via httpx.Client: the same as the first HTTP row, through httpx.

Latency is per request (for batches: per 100 events).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from workloads import pct

import stepstone as ss

KEY = "bench-key"
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


def report(label: str, events: int, elapsed: float, latencies: list[float]) -> None:
    rate = events / elapsed
    print(
        f"{label:<34} {rate:>10,.0f} events/s   p50 {pct(latencies, 0.5) * 1e3:6.2f} ms"
        f"   p99 {pct(latencies, 0.99) * 1e3:6.2f} ms   ({events} events)"
    )


def registered_app(url: str) -> ss.App:
    app = ss.App("bench", database_url=url)
    app.function(id="ingested", trigger=ss.on_event("bench.event"))(lambda ctx: None)
    app.store  # noqa: B018 - migrate and register the function
    return app


def event(i: int) -> dict[str, object]:
    return {"name": "bench.event", "data": {"i": i, "tenant": f"t{i % 10}", "payload": "x" * 200}}


def in_process(url: str, n: int, concurrency: int) -> None:
    app = registered_app(url)
    for i in range(200):  # warm-up
        app.send(ss.Event("bench.event", event(i)["data"]))  # type: ignore[arg-type]
    latencies = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        app.send(ss.Event("bench.event", event(i)["data"]))  # type: ignore[arg-type]
        latencies.append(time.perf_counter() - t)
    report("in-process sequential", n, time.perf_counter() - start, latencies)

    async def one(i: int) -> None:
        await app.send_async(ss.Event("bench.event", event(i)["data"]))  # type: ignore[arg-type]

    elapsed, latencies = asyncio.run(concurrently(one, n, concurrency))
    report(f"in-process concurrent ({concurrency})", n, elapsed, latencies)
    app.close()


async def concurrently(
    call: Callable[[int], Awaitable[None]], n: int, concurrency: int
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    counter = iter(range(n))

    async def lane() -> None:
        for i in counter:
            t = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - start, latencies


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [
            STEPSTONE,
            "--log-level",
            "WARNING",
            "server",
            "--database-url",
            url,
            "--port",
            str(port),
            "--no-access-log",
        ],
        env={**os.environ, "STEPSTONE_API_KEY": KEY},
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return process, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit("the server did not start")
        time.sleep(0.05)


class KeepAlive:
    """A minimal HTTP/1.1 client on one kept-alive connection. The benchmark uses it
    rather than httpx's async pool, which costs more than the server itself at 16
    connections on this machine (measured: ~550 events/s through httpx against
    ~1,600 through this)."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def open(self) -> KeepAlive:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, body: object) -> bytes:
        data = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        payload = await self.reader.readexactly(length)
        if status != 200:
            raise SystemExit(f"HTTP {status}: {payload[:200]!r}")
        return payload

    def close(self) -> None:
        self.writer.close()


async def over_http(base: str, n: int, concurrency: int, batch: int) -> None:
    port = int(base.rsplit(":", 1)[1])
    conn = await KeepAlive(port).open()

    async def single(i: int, c: KeepAlive = conn) -> None:
        await c.post("/api/v1/events", event(i))

    await concurrently(single, 200, 1)  # warm-up
    elapsed, latencies = await concurrently(single, n, 1)
    report("HTTP sequential (keep-alive)", n, elapsed, latencies)

    async def batched(b: int) -> None:
        await conn.post("/api/v1/events", [event(b * batch + i) for i in range(batch)])

    batches = max(1, n // batch)
    elapsed, latencies = await concurrently(batched, batches, 1)
    report(f"HTTP batches of {batch} (per request)", batches * batch, elapsed, latencies)
    conn.close()

    pool = [await KeepAlive(port).open() for _ in range(concurrency)]
    free = list(pool)

    async def pooled(i: int) -> None:
        c = free.pop()
        try:
            await c.post("/api/v1/events", event(i))
        finally:
            free.append(c)

    await concurrently(pooled, 200, concurrency)
    elapsed, latencies = await concurrently(pooled, n, concurrency)
    report(f"HTTP concurrent ({concurrency} connections)", n, elapsed, latencies)
    for c in pool:
        c.close()


def with_httpx(base: str, n: int) -> None:
    """For reference: what a Python caller gets with httpx.Client (sync, keep-alive)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as client:
        for i in range(200):
            client.post("/api/v1/events", json=event(i)).raise_for_status()
        latencies = []
        start = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            client.post("/api/v1/events", json=event(i)).raise_for_status()
            latencies.append(time.perf_counter() - t)
    report("HTTP sequential via httpx.Client", n, time.perf_counter() - start, latencies)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--sync", default="full", choices=["full", "normal"])
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, synchronous={args.sync}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as folder:
        in_process(f"sqlite:///{folder}/local.db?synchronous={args.sync}", args.events, args.concurrency)
        url = f"sqlite:///{folder}/http.db?synchronous={args.sync}"
        registered_app(url).close()
        process, base = start_server(url)
        try:
            asyncio.run(over_http(base, args.events, args.concurrency, args.batch))
            with_httpx(base, args.events)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
