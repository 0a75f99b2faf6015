"""The classic workflow: charge a card, insert a record, provision access.

Provisioning is flaky (it fails twice, then works) and, in the second act, has
a bug that fails every attempt until it is fixed and the run is replayed. The
ledger shows that the card was charged once per order either way.

The charge goes to an external API: ``step.run`` with an idempotency key (the
provider deduplicates a retried call). The subscription row goes to our own
database: ``step.transaction`` writes it in the very transaction that commits
the step's checkpoint, so it exists exactly once, even if the process dies
between the insert and the checkpoint.

Run it with ``./scripts/demo.sh`` (or ``python examples/charge_and_provision.py``).
The database stays in ``.stepstone/demo/`` (``$DEMO_DIR`` to move it), a path
that does not change from one import to the next, so that
``stepstone dev examples.charge_and_provision:app`` (the command the demo ends
with) opens the same runs in the dashboard, and keeps them across its reloads.
Running the demo itself starts from an empty database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import sys
from pathlib import Path

import stepstone as ss

ROOT = Path(__file__).resolve().parents[1]
WORKDIR = Path(os.environ.get("DEMO_DIR") or ROOT / ".stepstone" / "demo")
if __name__ == "__main__":  # the scenario starts afresh; importing (stepstone dev) reopens its runs
    shutil.rmtree(WORKDIR, ignore_errors=True)
WORKDIR.mkdir(parents=True, exist_ok=True)
app = ss.App("shop", database_url=f"sqlite:///{WORKDIR}/stepstone.db")
# The shop's own table lives in the Stepstone database: step.transaction writes it.
with sqlite3.connect(f"{WORKDIR}/stepstone.db") as shop:
    shop.execute(
        "CREATE TABLE IF NOT EXISTS subscriptions (id TEXT PRIMARY KEY, order_id TEXT, payment_id TEXT)"
    )
ledger = sqlite3.connect(f"{WORKDIR}/ledger.db", isolation_level=None, check_same_thread=False)
ledger.execute("CREATE TABLE IF NOT EXISTS effects (order_id TEXT, action TEXT, detail TEXT)")
provisioning = {"failures_left": 2, "bug": False}


def record(order_id: str, action: str, detail: str = "") -> None:
    ledger.execute("INSERT INTO effects VALUES (?, ?, ?)", (order_id, action, detail))


def charge(order_id: str, amount: int, idempotency_key: str) -> dict[str, object]:
    record(order_id, "charge", f"{amount} cents, key {idempotency_key}")
    return {"id": f"ch_{order_id}", "amount": amount}


def insert_subscription(conn: sqlite3.Connection, order_id: str, payment_id: str) -> dict[str, object]:
    """Runs inside the step's checkpoint transaction: keep it short."""
    conn.execute(
        "INSERT INTO subscriptions (id, order_id, payment_id) VALUES (?, ?, ?)",
        (f"sub_{order_id}", order_id, payment_id),
    )
    return {"id": f"sub_{order_id}"}


def grant_access(order_id: str, user_id: str) -> str:
    record(order_id, "provision-attempt")
    if provisioning["bug"]:
        raise KeyError("plan_tier")  # the bug: fails every attempt
    if provisioning["failures_left"] > 0:
        provisioning["failures_left"] -= 1
        raise ConnectionError("provisioning service timed out")
    record(order_id, "provisioned", user_id)
    return "granted"


@app.function(
    id="charge-and-provision",
    trigger=ss.on_event("user.subscription.created", if_="event.data.plan != 'free'"),
    retries=3,
    backoff=ss.Backoff(initial="200ms", factor=2, max="2s"),
)
def charge_and_provision(ctx: ss.Context) -> dict[str, object]:
    data = ctx.event.data
    key = ctx.step.idempotency_key("charge-user")
    payment = ctx.step.run("charge-user", charge, data["order_id"], data["amount"], key)
    row = ctx.step.transaction(
        "create-subscription-record", insert_subscription, data["order_id"], payment["id"]
    )
    ctx.step.run("provision-access", grant_access, data["order_id"], data["user_id"])
    return {"subscription_id": row["id"]}


def show(run: ss.Run, order_id: str) -> None:
    print(f"  run {run.id}: {run.status}  output={run.output}")
    for step in run.steps:
        error = f"  last error: {step.error.type}: {step.error.message}" if step.error else ""
        print(f"    step {step.id:<28} {step.status:<10} attempts={step.attempts}{error}")
    rows = ledger.execute(
        "SELECT action, COUNT(*) FROM effects WHERE order_id = ? GROUP BY action ORDER BY MIN(rowid)",
        (order_id,),
    ).fetchall()
    print("  ledger: " + ", ".join(f"{action} x{count}" for action, count in rows))
    print(f"  subscriptions rows: {subscriptions(order_id)}")


def order(order_id: str) -> ss.Run:
    [event_id] = app.send(
        ss.Event(
            "user.subscription.created",
            {
                "order_id": order_id,
                "user_id": "u-42",
                "amount": 4900,
                "plan": "pro",
            },
            id=order_id,
        )
    )
    [run] = app.runs.list(event_id=event_id)
    return app.runs.wait(run.id, timeout="30s")


def count(order_id: str, action: str) -> int:
    row = ledger.execute(
        "SELECT COUNT(*) FROM effects WHERE order_id = ? AND action = ?", (order_id, action)
    ).fetchone()
    return int(row[0])


def subscriptions(order_id: str) -> int:
    with sqlite3.connect(f"{WORKDIR}/stepstone.db") as conn:
        row = conn.execute("SELECT COUNT(*) FROM subscriptions WHERE order_id = ?", (order_id,)).fetchone()
    return int(row[0])


def main() -> int:
    print(f"Stepstone demo on SQLite ({WORKDIR}/stepstone.db)\n")
    app.start(concurrency=4)
    try:
        print("1. Provisioning times out twice, then works: only that step is retried.")
        run = order("order-1")
        show(run, "order-1")
        assert run.status == "completed" and count("order-1", "charge") == 1
        assert subscriptions("order-1") == 1

        print("\n2. A bug fails provisioning on every attempt: the run fails after its retries.")
        provisioning["bug"] = True
        run = order("order-2")
        show(run, "order-2")
        assert run.status == "failed"

        print("\n   Fix the bug, replay the run: it resumes at the failed step.")
        provisioning["bug"] = False
        app.runs.replay(run.id)
        run = app.runs.wait(run.id, timeout="30s")
        show(run, "order-2")
        assert run.status == "completed" and count("order-2", "charge") == 1
        assert subscriptions("order-2") == 1

        print("\n3. The same order sent again (same event id) starts no second run.")
        app.send(
            ss.Event(
                "user.subscription.created",
                {"order_id": "order-1", "user_id": "u-42", "amount": 4900, "plan": "pro"},
                id="order-1",
            )
        )
        print(
            f"   runs for order-1: {len(app.runs.list(event_id='order-1'))}, "
            f"charges: {count('order-1', 'charge')}"
        )
    finally:
        app.stop()
    print("\nEvery card was charged exactly once; every subscription row exists once.")
    print_dashboard_command()
    return 0


def print_dashboard_command(port: int = 8288) -> None:
    """The one command that serves these runs (traces, failed attempts, the replay)."""
    key = secrets.token_urlsafe(18)
    target = "examples.charge_and_provision:app"
    where = f"DEMO_DIR={WORKDIR} " if os.environ.get("DEMO_DIR") else ""
    print(
        "\nSee these runs in the dashboard (each trace, the failed attempts, the replay):\n"
        f"  cd {ROOT} && {where}STEPSTONE_API_KEY={key} .venv/bin/stepstone dev {target} --port {port}\n"
        f"then open http://127.0.0.1:{port}/ and sign in with the key {key}\n"
        f"(API docs: http://127.0.0.1:{port}/docs)"
    )


if __name__ == "__main__":
    sys.exit(main())
