"""A worker's slots (stepstone/slots.py): a send may take slots a lease pass
claimed until the pass finds work, never after, and never more than are free."""

from __future__ import annotations

from stepstone.slots import Slots


def test_a_send_takes_from_a_pass_that_has_found_no_work_yet() -> None:
    busy = [1]
    slots = Slots(4, lambda: busy[0])
    assert slots.claim_pass() == 3 and slots.free() == 0
    assert slots.offered() == 3
    assert slots.reserve(2) == 2  # from the pass's claim
    assert slots.seal_pass() == 1 and slots.pass_room == 1
    assert slots.reserve(1) == 0  # sealed: nothing more
    slots.end_pass()
    assert slots.claimed == 2 and slots.free() == 1
    busy[0] += 2  # the send's runs are in flight now
    assert slots.release(2) and slots.free() == 1


def test_in_flight_plus_claimed_never_exceed_the_concurrency() -> None:
    slots = Slots(2, lambda: 0)
    assert slots.reserve(5) == 2 and slots.claim_pass() == 0 and slots.reserve(1) == 0
    assert not slots.release(1) and slots.release(1)


def test_a_closed_worker_gives_no_slot() -> None:
    slots = Slots(3, lambda: 0)
    slots.close()
    assert slots.reserve(1) == 0 and slots.offered() == 0
    assert slots.claim_pass() == 3  # its own passes go on until it stops
