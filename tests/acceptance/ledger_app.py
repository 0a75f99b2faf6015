"""A workflow whose steps write a side-effect ledger (imported by worker processes)."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
import uuid

import stepstone as ss
from stepstone.store import faults

DATABASE_URL = os.environ["STEPSTONE_DATABASE_URL"]
APP_VERSION = os.environ.get("APP_VERSION")  # the deploy a worker process runs (see "versioned")
app = ss.App("ledger", database_url=DATABASE_URL, app_version=APP_VERSION)
LEDGER = os.environ["LEDGER_PATH"]
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.2"))
# GATE_STEP's first execution in a run waits for the file GATE_PATH to exist;
# its later executions take GATE_SECONDS (a test decides which ends first).
GATE_STEP = os.environ.get("GATE_STEP")
GATE_PATH = os.environ.get("GATE_PATH", "")
GATE_SECONDS = float(os.environ.get("GATE_SECONDS", "0"))
CHAOS_FAIL_RATE = float(os.environ.get("CHAOS_FAIL_RATE", "0.25"))
CHAOS_SLEEP = os.environ.get("CHAOS_SLEEP", "300ms")


def _record(
    conn: sqlite3.Connection, run_id: str, step: str, phase: str, token: str | None, at: float | None = None
) -> None:
    conn.execute(
        "INSERT INTO ledger (run_id, step, phase, pid, at, token) VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, step, phase, os.getpid(), time.time() if at is None else at, token),
    )


def effect(run_id: str, step: str, token: str | None = None, fail_rate: float = 0.0) -> str:
    entered = time.time()  # a start is when the step's function was entered, not when its row was written
    conn = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")  # the ledger is test scaffolding: no fsync needed
        _record(conn, run_id, step, "start", token, entered)
        if step == GATE_STEP:
            _gate(conn, run_id, step)
        else:
            time.sleep(STEP_SECONDS)
        if random.random() < fail_rate:
            _record(conn, run_id, step, "fail", token)
            raise RuntimeError(f"{step} failed (injected)")
        _record(conn, run_id, step, "end", token)
    finally:
        conn.close()
    return step


def _gate(conn: sqlite3.Connection, run_id: str, step: str) -> None:
    [(starts,)] = conn.execute(
        "SELECT COUNT(*) FROM ledger WHERE run_id = ? AND step = ? AND phase = 'start'", (run_id, step)
    ).fetchall()
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


def tokened_effect(run_id: str, step: str, fail_rate: float = 0.0) -> str:
    """One execution of a chaos step under a token of its own, returned as the
    step's result: the memo names the one execution whose checkpoint committed."""
    token = uuid.uuid4().hex
    effect(run_id, step, token, fail_rate)
    return token


CHAOS_STEPS = ("charge", "record", "provision")  # in the order a run executes them


@app.function(
    id="chaos",
    trigger=ss.on_event("chaos"),
    retries=1,
    backoff=ss.Backoff(initial="100ms", factor=1, max="100ms", jitter=0),
)
def chaos(ctx: ss.Context) -> list[str]:
    """The chaos suite's workflow: a step, a durable sleep, a step that fails at
    random (retried once, so some runs fail), a last step."""
    charge = ctx.step.run("charge", tokened_effect, ctx.run_id, "charge")
    ctx.step.sleep("cool-off", CHAOS_SLEEP)
    record = ctx.step.run("record", tokened_effect, ctx.run_id, "record", CHAOS_FAIL_RATE)
    provision = ctx.step.run("provision", tokened_effect, ctx.run_id, "provision")
    return [charge, record, provision]


PRELUDE_SECONDS = float(os.environ.get("PRELUDE_SECONDS", "0"))


@app.function(id="prelude", trigger=ss.on_event("prelude"))
def prelude(ctx: ss.Context) -> str:
    """Slow code outside steps (replayed on every invocation) before the one step;
    its ledger row marks that an invocation began (scaffolding, not a side effect)."""
    conn = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    try:
        _record(conn, ctx.run_id, "prelude", "start", None)
    finally:
        conn.close()
    time.sleep(PRELUDE_SECONDS)
    charged: str = ctx.step.run("charge", tagged_effect, ctx.run_id, "charge")
    return charged


# -- transactional steps (issue 15) -------------------------------------------------------------
# KILL_INSIDE names a commit site: this process SIGKILLs itself inside that
# commit's transaction, after its work and before its COMMIT (store/faults.py).
if os.environ.get("KILL_INSIDE"):
    _kill = faults.inject(
        os.environ["KILL_INSIDE"], "inside", during=lambda: os.kill(os.getpid(), signal.SIGKILL)
    )
    _kill.__enter__()


@app.function(id="txn-record", trigger=ss.on_event("txn-record"))
def txn_record(ctx: ss.Context) -> str:
    """The row is written by the step's own transaction."""
    from tests import usertables  # here: only these tests put the repository on the path

    user = ctx.step.transaction("create-record", usertables.inserter(DATABASE_URL), ctx.event.data["user"])
    return str(ctx.step.run("after", lambda: user))


@app.function(id="run-record", trigger=ss.on_event("run-record"))
def run_record(ctx: ss.Context) -> str:
    """The same with a plain step.run: its own connection commits the row."""
    from tests import usertables

    user = ctx.step.run("create-record", usertables.insert_and_commit, DATABASE_URL, ctx.event.data["user"])
    return str(ctx.step.run("after", lambda: user))


@app.function(id="approval", trigger=ss.on_event("approval"))
def approval(ctx: ss.Context) -> list[object]:
    """A step, a wait for the run's "approved" signal, a step (issue 14)."""
    charge = ctx.step.run("charge", effect, ctx.run_id, "charge")
    approved = ctx.step.wait_for_signal("approval", "approved", timeout="120s")
    provision = ctx.step.run("provision", effect, ctx.run_id, "provision")
    return [charge, approved, provision]


@app.function(id="versioned", trigger=ss.on_event("versioned"), retries=0, on_nondeterminism="pause")
def versioned(ctx: ss.Context) -> str:
    """Three deploys of one workflow: v1 charges, then waits; v2 inserts an audit
    step before the wait (a run from v1 diverges there); v3 audits after it."""
    ctx.step.run("charge", effect, ctx.run_id, "charge")
    if APP_VERSION == "v2":
        ctx.step.run("audit", effect, ctx.run_id, "audit")
    ctx.step.wait_for_event("hold", event="versioned.go-on", timeout="1h")
    if APP_VERSION == "v3":
        ctx.step.run("audit", effect, ctx.run_id, "audit")
    return str(ctx.step.run("ship", effect, ctx.run_id, "ship"))


LONG_STEPS = int(os.environ.get("LONG_STEPS", "150"))
LONG_OUTPUT = 20_000  # bytes of each step's output: the history outgrows a memo page many times


def large_effect(run_id: str, step: str) -> str:
    effect(run_id, step)
    return f"{step}:" + "x" * LONG_OUTPUT


@app.function(id="long-history", trigger=ss.on_event("long"), max_state=None)
def long_history(ctx: ss.Context) -> list[list[object]]:
    """Many steps with large outputs: a resumed worker replays them from memo pages."""
    values = [ctx.step.run(f"s{i}", large_effect, ctx.run_id, f"s{i}") for i in range(LONG_STEPS)]
    return [[value.split(":", 1)[0], len(value)] for value in values]
