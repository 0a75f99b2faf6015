"""A workflow whose steps write a side-effect ledger (imported by worker processes)."""

from __future__ import annotations

import os
import sqlite3
import time

import stepstone as ss

app = ss.App("ledger", database_url=os.environ["STEPSTONE_DATABASE_URL"])
LEDGER = os.environ["LEDGER_PATH"]
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.2"))
# GATE_STEP's first execution in a run waits for the file GATE_PATH to exist;
# its later executions take GATE_SECONDS (a test decides which ends first).
GATE_STEP = os.environ.get("GATE_STEP")
GATE_PATH = os.environ.get("GATE_PATH", "")
GATE_SECONDS = float(os.environ.get("GATE_SECONDS", "0"))


def effect(run_id: str, step: str) -> str:
    conn = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")  # the ledger is test scaffolding: no fsync needed
        conn.execute("INSERT INTO ledger (run_id, step, phase, pid, at) VALUES (?, ?, 'start', ?, ?)",
                     (run_id, step, os.getpid(), time.time()))
        if step == GATE_STEP:
            _gate(conn, run_id, step)
        else:
            time.sleep(STEP_SECONDS)
        conn.execute("INSERT INTO ledger (run_id, step, phase, pid, at) VALUES (?, ?, 'end', ?, ?)",
                     (run_id, step, os.getpid(), time.time()))
    finally:
        conn.close()
    return step


def _gate(conn: sqlite3.Connection, run_id: str, step: str) -> None:
    [(starts,)] = conn.execute("SELECT COUNT(*) FROM ledger WHERE run_id = ? AND step = ? AND phase = 'start'",
                               (run_id, step)).fetchall()
    if starts > 1:
        time.sleep(GATE_SECONDS)
        return
    deadline = time.monotonic() + 60
    while not os.path.exists(GATE_PATH) and time.monotonic() < deadline:
        time.sleep(0.01)


@app.function(id="three-steps", trigger=ss.on_event("work"))
def three_steps(ctx: ss.Context) -> list[str]:
    return [ctx.step.run(name, effect, ctx.run_id, name) for name in ("charge", "record", "provision")]


def tagged_effect(run_id: str, step: str) -> str:
    effect(run_id, step)
    return f"{step}@{os.getpid()}"  # which process's result was committed


@app.function(id="tagged", trigger=ss.on_event("tagged"))
def tagged(ctx: ss.Context) -> list[str]:
    return [ctx.step.run(name, tagged_effect, ctx.run_id, name) for name in ("charge", "record", "provision")]
