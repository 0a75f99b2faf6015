"""A process whose app sends a run while its own worker runs in it (a direct
start, app.py), says which runs were handed to that worker in memory, then
waits to be killed (test_direct_start_kill.py). Arguments: the lease TTL, and
the event's name (default "work")."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import stepstone as ss
from stepstone.store.rows import LeasedRun
from stepstone.worker import Worker
from tests.acceptance.ledger_app import app

real_hand_over = Worker.hand_over


def hand_over(self: Worker, leased: Sequence[LeasedRun], reserved: int, sent: float, now: float) -> None:
    print("handed", *[item.run.id for item in leased], flush=True)
    real_hand_over(self, leased, reserved, sent, now)


if __name__ == "__main__":
    Worker.hand_over = hand_over  # type: ignore[method-assign]
    app.start(lease_ttl=float(sys.argv[1]))
    [event_id] = app.send(ss.Event(sys.argv[2] if len(sys.argv) > 2 else "work"))
    print("sent", app.runs.list(event_id=event_id)[0].id, flush=True)
    time.sleep(600)  # until the test kills the process
