"""An app served over HTTP by a process without a database (``ss.serve`` under
uvicorn: ``served_app:asgi``; ``ss.serve_wsgi`` mounted in a Flask app:
``flask_app.py PORT``), its steps writing the side-effect ledger. Keys come from
ENDPOINT_KEY (and ENDPOINT_KEY_FALLBACK); MAX_DURATION bounds each request."""

from __future__ import annotations

import os
import sqlite3
import time

import stepstone as ss

LEDGER = os.environ["LEDGER_PATH"]
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.05"))
# A database the endpoint must never open: any attempt fails loudly.
app = ss.App("served", database_url="sqlite:////nonexistent/stepstone-endpoint.db")


def effect(run_id: str, step: str, fail_first: bool = False) -> str:
    conn = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute(
            "INSERT INTO ledger (run_id, step, phase, pid, at, token) VALUES (?, ?, 'start', ?, ?, NULL)",
            (run_id, step, os.getpid(), time.time()),
        )
        [(starts,)] = conn.execute(
            "SELECT COUNT(*) FROM ledger WHERE run_id = ? AND step = ? AND phase = 'start'", (run_id, step)
        ).fetchall()
        time.sleep(STEP_SECONDS)
        if fail_first and starts == 1:
            conn.execute(
                "INSERT INTO ledger (run_id, step, phase, pid, at, token) VALUES (?, ?, 'fail', ?, ?, NULL)",
                (run_id, step, os.getpid(), time.time()),
            )
            raise RuntimeError(f"{step} fails the first time")
        conn.execute(
            "INSERT INTO ledger (run_id, step, phase, pid, at, token) VALUES (?, ?, 'end', ?, ?, NULL)",
            (run_id, step, os.getpid(), time.time()),
        )
    finally:
        conn.close()
    return step


@app.function(
    id="order",
    trigger=ss.on_event("order"),
    retries=2,
    backoff=ss.Backoff(initial="100ms", factor=1, max="100ms", jitter=0),
)
def order(ctx: ss.Context) -> list[str]:
    """A step, a durable sleep, a step that fails once (retried), a last step."""
    charge = ctx.step.run("charge", effect, ctx.run_id, "charge")
    ctx.step.sleep("cool-off", "300ms")
    record = ctx.step.run("record", effect, ctx.run_id, "record", True)
    provision = ctx.step.run("provision", effect, ctx.run_id, "provision")
    return [charge, record, provision]


LONG_STEPS = int(os.environ.get("LONG_STEPS", "12"))


@app.function(id="long", trigger=ss.on_event("long"))
async def long(ctx: ss.Context) -> int:
    """Many steps: with a small MAX_DURATION it spans many requests."""
    for n in range(LONG_STEPS):
        await ctx.step.run(f"s{n}", _effect_async, ctx.run_id, f"s{n}")
    return LONG_STEPS


async def _effect_async(run_id: str, step: str) -> str:
    import asyncio

    return await asyncio.to_thread(effect, run_id, step)


@app.function(id="gated", trigger=ss.on_event("gated"))
def gated(ctx: ss.Context) -> str:
    """Its first step waits for the file GATE_PATH (a test cancels meanwhile)."""

    def gate() -> str:
        effect(ctx.run_id, "gate")
        deadline = time.monotonic() + 30
        while not os.path.exists(os.environ["GATE_PATH"]) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "opened"

    ctx.step.run("gate", gate)
    ctx.step.run("after", effect, ctx.run_id, "after")
    return "finished"


@app.function(id="square", trigger=ss.on_event("square"))
def square(ctx: ss.Context) -> int:
    return int(ctx.event.data["x"]) ** 2


@app.function(id="served-parent", trigger=ss.on_event("served-parent"))
async def served_parent(ctx: ss.Context) -> object:
    """Invokes a function a worker serves (the test's ``double``)."""
    return await ctx.step.invoke("call", function="double", data={"x": 21}, timeout="30s")


_keys = {
    "signing_key": os.environ["ENDPOINT_KEY"],
    "signing_key_fallback": os.environ.get("ENDPOINT_KEY_FALLBACK") or None,
    "max_duration": float(os.environ.get("MAX_DURATION", "60")),
}
asgi = ss.serve(app, **_keys)  # type: ignore[arg-type]
wsgi = ss.serve_wsgi(app, **_keys)  # type: ignore[arg-type]
