"""Admission against the in-memory store: what each flow option decides when
an event arrives (runtime/admission.py), through ``runtime.ingest``."""

from __future__ import annotations

import json

import pytest

import stepstone as ss
from stepstone.limits import DEDUPE_WINDOW_SECONDS
from stepstone.registry import Registry
from stepstone.runtime import cancel_run, end_run
from stepstone.store.rows import RunStatus
from tests.fakes.world import World


@pytest.fixture
def world() -> World:
    return World()


def skip_reason(world: World, run_id: str) -> str | None:
    meta = world.run(run_id).meta
    return None if meta is None else str(json.loads(meta)["skipped"])


def test_an_event_starts_a_queued_run_of_each_function_it_triggers(world: World) -> None:
    world.function("a", event="go")
    world.function("b", event="go")
    world.send("go")
    assert [r.status for r in world.runs_of("a") + world.runs_of("b")] == [RunStatus.QUEUED] * 2


def test_an_event_no_function_listens_to_starts_nothing(world: World) -> None:
    world.function("a", event="go")
    assert world.send("other") == []
    assert world.store.state.events  # but it is recorded


def test_an_event_id_seen_before_is_not_ingested_again(world: World) -> None:
    world.function("f")
    assert len(world.send("f", event_id="e1")) == 1
    assert world.send("f", event_id="e1") == []
    world.now += DEDUPE_WINDOW_SECONDS
    assert len(world.send("f", event_id="e1")) == 1  # the window passed


def test_an_idempotency_key_starts_one_run_per_key(world: World) -> None:
    world.function("f", idempotency="event.data.order")
    assert len(world.send("f", {"order": 1})) == 1
    assert world.send("f", {"order": 1}) == []
    assert len(world.send("f", {"order": 2})) == 1


def test_an_idempotency_key_expires_after_the_dedupe_window(world: World) -> None:
    world.function("f", idempotency="event.data.order")
    world.send("f", {"order": 1})
    world.now += DEDUPE_WINDOW_SECONDS
    assert len(world.send("f", {"order": 1})) == 1


def test_a_rate_limit_skips_runs_over_it_per_key(world: World) -> None:
    world.function("f", rate_limit=ss.RateLimit(limit=2, period="1h", key="event.data.user"))
    ids = [world.send("f", {"user": "u"})[0] for _ in range(3)]
    assert [world.run(i).status for i in ids] == [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.SKIPPED]
    assert "rate limit" in (skip_reason(world, ids[2]) or "")
    [other] = world.send("f", {"user": "v"})
    assert world.run(other).status == RunStatus.QUEUED


def test_a_rate_limit_admits_again_after_its_period(world: World) -> None:
    world.function("f", rate_limit=ss.RateLimit(limit=1, period="1h"))
    world.send("f")
    world.now += 1800
    assert world.run(world.send("f")[0]).status == RunStatus.SKIPPED
    world.now += 1800
    assert world.run(world.send("f")[0]).status == RunStatus.QUEUED


def test_a_skipped_run_is_never_leased(world: World) -> None:
    world.function("f", rate_limit=ss.RateLimit(limit=1, period="1h"))
    world.send("f")
    world.send("f")
    assert len(world.lease()) == 1


def test_debounced_events_gather_into_one_run_with_the_last_event(world: World) -> None:
    world.function("f", debounce=ss.Debounce(period="10s"))
    [run_id] = world.send("f", {"n": 1})
    world.now += 5
    assert world.send("f", {"n": 2}) == []  # joined the pending run
    assert len(world.runs_of("f")) == 1
    [event] = world.apply(lambda tx: tx.get_events(run_id))
    assert json.loads(event.data) == {"n": 2}


def test_a_debounced_run_starts_a_period_after_the_last_event(world: World) -> None:
    world.function("f", debounce=ss.Debounce(period="10s"))
    world.send("f")
    world.now += 5
    world.send("f")
    world.now += 9.9
    assert world.lease() == []
    world.now += 0.1
    assert len(world.lease()) == 1


def test_a_debounce_timeout_caps_how_long_events_push_the_start_back(world: World) -> None:
    world.function("f", debounce=ss.Debounce(period="10s", timeout="15s"))
    world.send("f")
    for _ in range(3):
        world.now += 5
        world.send("f")
    assert len(world.runs_of("f")) == 1
    assert world.store.state.queue[world.runs_of("f")[0].id].available_at == pytest.approx(1_000_015.0)


def test_an_event_after_a_debounced_run_started_opens_a_new_run(world: World) -> None:
    world.function("f", debounce=ss.Debounce(period="1s"))
    world.send("f")
    world.now += 1
    world.lease()
    assert len(world.send("f")) == 1
    assert len(world.runs_of("f")) == 2


def test_debounce_keys_gather_separately(world: World) -> None:
    world.function("f", debounce=ss.Debounce(period="10s", key="event.data.doc"))
    world.send("f", {"doc": 1})
    world.send("f", {"doc": 2})
    world.send("f", {"doc": 1})
    assert len(world.runs_of("f")) == 2


def test_a_batch_gathers_events_into_one_run_until_its_timeout(world: World) -> None:
    world.function("f", batch=ss.Batch(max_size=5, timeout="10s"))
    [run_id] = world.send("f", {"n": 1})
    world.send("f", {"n": 2})
    assert world.run(run_id).event_ids and len(world.run(run_id).event_ids) == 2
    world.now += 9.9
    assert world.lease() == []
    world.now += 0.1
    [leased] = world.lease()
    assert [json.loads(e.data)["n"] for e in leased.events] == [1, 2]


def test_a_full_batch_is_due_at_once_and_the_next_event_opens_another(world: World) -> None:
    world.function("f", batch=ss.Batch(max_size=2, timeout="1h"))
    world.send("f")
    world.send("f")
    assert len(world.lease()) == 1
    assert len(world.send("f")) == 1
    assert len(world.runs_of("f")) == 2


def test_a_singleton_skips_a_run_while_its_holder_is_active(world: World) -> None:
    world.function("f", singleton=ss.Singleton())
    [first] = world.send("f")
    [second] = world.send("f")
    assert world.run(second).status == RunStatus.SKIPPED
    assert first in (skip_reason(world, second) or "")


def test_a_singleton_key_is_free_again_once_its_holder_ended(world: World) -> None:
    world.function("f", singleton=ss.Singleton())
    [first] = world.send("f")
    registry: Registry = world.registry
    holder = world.run(first)
    world.apply(lambda tx: end_run(tx, holder, RunStatus.COMPLETED, "null", None, world.now, registry))
    [second] = world.send("f")
    assert world.run(second).status == RunStatus.QUEUED


def test_a_singleton_in_cancel_mode_replaces_its_holder(world: World) -> None:
    world.function("f", singleton=ss.Singleton(mode="cancel"))
    [first] = world.send("f")
    [second] = world.send("f")
    assert (world.run(first).status, world.run(second).status) == (RunStatus.CANCELLED, RunStatus.QUEUED)
    assert "singleton" in (world.run(first).error or "")


def test_singleton_keys_are_per_key_value(world: World) -> None:
    world.function("f", singleton=ss.Singleton(key="event.data.user"))
    world.send("f", {"user": "a"})
    [other] = world.send("f", {"user": "b"})
    assert world.run(other).status == RunStatus.QUEUED


def test_a_cancel_on_event_cancels_a_queued_run(world: World) -> None:
    world.function("f", cancel_on=ss.CancelOn(event="stop", if_="event.data.id == async.data.id"))
    [keep] = world.send("f", {"id": 1})
    [doomed] = world.send("f", {"id": 2})
    world.send("stop", {"id": 2})
    assert (world.run(keep).status, world.run(doomed).status) == (RunStatus.QUEUED, RunStatus.CANCELLED)


def test_a_cancel_on_event_flags_a_held_run_instead_of_ending_it(world: World) -> None:
    world.function("f", cancel_on=ss.CancelOn(event="stop"))
    [run_id] = world.send("f")
    world.lease()
    world.send("stop")
    assert world.run(run_id).status == RunStatus.RUNNING
    assert world.store.state.queue[run_id].cancel_requested


def test_cancelling_a_queued_run_ends_it_at_once(world: World) -> None:
    world.function("f")
    [run_id] = world.send("f")
    registry: Registry = world.registry
    assert world.apply(lambda tx: cancel_run(tx, run_id, world.now, registry)) == RunStatus.CANCELLED
    assert world.lease() == []


def test_a_concurrency_key_is_placed_on_the_queue_item(world: World) -> None:
    world.function("f", concurrency=ss.Concurrency(limit=3, key="event.data.tenant"))
    [run_id] = world.send("f", {"tenant": "t1"})
    item = world.store.state.queue[run_id]
    assert item.limit1 == 3 and item.ckey1 is not None and "t1" in item.ckey1
