"""Flow rules meet each other in admission order (stepstone.flow.POLICIES), and
a process without a function's code admits its events under the same rules,
rebuilt from the stored description (the catalog). Both stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

from ..conftest import query, run_of


def _statuses(app: ss.App, event_ids: list[str], function_id: str) -> list[str | None]:
    """The status of the run each event started (``None``: it started none)."""
    found = []
    for event_id in event_ids:
        runs = app.runs.list(event_id=event_id, function_id=function_id)
        found.append(runs[0].status if runs else None)
    return found


def _queued(db_url: str, run_id: str) -> dict[str, Any]:
    columns = "partition_key, ckey1, limit1, ckey2, limit2, throttle_key, available_at, sort_at"
    [row] = query(db_url, f"SELECT {columns} FROM queue WHERE run_id = '{run_id}'")
    return dict(zip(columns.split(", "), row, strict=True))


def test_the_queue_placement_keeps_its_stored_form(app: ss.App, db_url: str) -> None:
    """Keys are stored in queued rows that other workers (and older code) read:
    their form is part of the contract. A debounce join re-sorts the pending run
    by the joining event's priority."""
    app.function(
        id="f",
        trigger=ss.on_event("e"),
        concurrency=[
            ss.Concurrency(limit=2, key="event.data.tenant"),
            ss.Concurrency(5, "event.data.region", "env"),
        ],
        throttle=ss.Throttle(limit=10, period="1m", key="event.data.tenant"),
        priority=ss.Priority(run="event.data.p"),
        debounce=ss.Debounce(period="1h", key="event.data.tenant"),
    )(lambda ctx: None)
    [first] = app.send(ss.Event("e", {"tenant": "t1", "region": "eu", "p": 60}))
    run_id = run_of(app, first, "f").id
    placed = _queued(db_url, run_id)
    assert {k: v for k, v in placed.items() if k not in ("available_at", "sort_at")} == {
        "partition_key": 'f|fn:f:"t1"',
        "ckey1": 'fn:f:"t1"',
        "limit1": 2,
        "ckey2": 'env:"eu"',
        "limit2": 5,
        "throttle_key": 'throttle:f:"t1"',
    }
    assert placed["available_at"] - placed["sort_at"] == pytest.approx(60)
    [second] = app.send(ss.Event("e", {"tenant": "t1", "region": "eu", "p": -30}))
    assert run_of(app, second, "f").id == run_id  # joined the pending run
    moved = _queued(db_url, run_id)
    assert moved["available_at"] >= placed["available_at"]
    assert moved["available_at"] - moved["sort_at"] == pytest.approx(-30)


def test_a_duplicate_spends_no_rate(app: ss.App) -> None:
    """Idempotency is checked before the rate limit: a repeat starts nothing and
    leaves the rate to the next distinct key."""
    app.function(
        id="pay",
        trigger=ss.on_event("pay"),
        idempotency="event.data.order",
        rate_limit=ss.RateLimit(limit=2, period="1h"),
    )(lambda ctx: None)
    ids = app.send([ss.Event("pay", {"order": n}) for n in (1, 1, 1, 2, 3)])
    assert _statuses(app, ids, "pay") == ["queued", None, None, "queued", "skipped"]


def test_a_rate_limited_run_claims_no_singleton_key(app: ss.App) -> None:
    app.function(
        id="edit",
        trigger=ss.on_event("edit"),
        rate_limit=ss.RateLimit(limit=1, period="1h", key="event.data.user"),
        singleton=ss.Singleton(key="event.data.doc", mode="skip"),
    )(lambda ctx: None)
    ids = app.send(
        [
            ss.Event("edit", {"user": "a", "doc": "X"}),
            ss.Event("edit", {"user": "a", "doc": "Y"}),  # rate-limited: must leave Y free
            ss.Event("edit", {"user": "b", "doc": "Y"}),
            ss.Event("edit", {"user": "c", "doc": "X"}),  # X is held by the first run
        ]
    )
    assert _statuses(app, ids, "edit") == ["queued", "skipped", "queued", "skipped"]
    reasons = [run_of(app, ids[i], "edit").meta["skipped"] for i in (1, 3)]
    assert "rate limit" in reasons[0] and "singleton" in reasons[1]


def test_a_sender_without_the_code_admits_under_the_same_rules(make_app: Callable[..., ss.App]) -> None:
    owner = make_app("shop")
    owner.function(
        id="pay",
        trigger=ss.on_event("pay"),
        idempotency="event.data.order",
        rate_limit=ss.RateLimit(limit=2, period="1h", key="event.data.user"),
        concurrency=[ss.Concurrency(limit=1, key="event.data.user")],
        priority=ss.Priority(run="event.data.vip ? 60 : 0"),
        timeouts=ss.Timeouts(finish="1h"),
    )(lambda ctx: None)
    owner.function(
        id="sync",
        trigger=ss.on_event("sync"),
        singleton=ss.Singleton(key="event.data.user", mode="cancel"),
        cancel_on=ss.CancelOn(event="user.deleted", if_="async.data.user == event.data.user"),
    )(lambda ctx: None)
    assert owner.store is not None  # opening the store registers the functions
    sender = make_app("web")  # no functions: admits through the catalog

    pays = sender.send([ss.Event("pay", {"order": n, "user": "u"}) for n in (1, 1, 2, 3)])
    assert _statuses(sender, pays, "pay") == ["queued", None, "queued", "skipped"]

    [old, new, other] = sender.send(
        [ss.Event("sync", {"user": "a"}), ss.Event("sync", {"user": "a"}), ss.Event("sync", {"user": "b"})]
    )
    replaced = run_of(sender, old, "sync")
    assert replaced.status == "cancelled" and replaced.error is not None
    assert "singleton" in replaced.error.message
    sender.send(ss.Event("user.deleted", {"user": "b"}))
    assert _statuses(sender, [new, other], "sync") == ["queued", "cancelled"]
