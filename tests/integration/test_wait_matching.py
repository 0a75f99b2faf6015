"""Indexed wait matching agrees with CEL: the index on ``async.data.X ==
event.data.Y`` only narrows the candidates, the condition decides.

Waits are parked with the real ``build_wait`` and events go through the real
``ingest`` (what ``app.send`` runs), on real SQLite and PostgreSQL stores, with
explicit ``now`` values: no workers, no timing. The property test compares the
engine with evaluating the condition with CEL directly, over generated pairs of
JSON values (missing, null, ints, floats equal to ints, bools, strings, lists,
maps) for the waiting run's ``event.data.y`` and the incoming ``async.data.x``.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.registry import Registry
from stepstone.runtime import PreparedEvent, Survey, ingest, prepare, survey
from stepstone.runtime.waits import SURVEY_AT, build_wait
from stepstone.store import faults, make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import NewEvent, NewRun, RunStatus, StepKind, StepRow, StepStatus, WaitKind, WaitRow

NOW = 1_000_000.0
MISSING: Any = object()  # the field is absent from the event's data
_ids = itertools.count()


def registry() -> Registry:
    app = ss.App("matching", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="f")(lambda ctx: None)
    return app.registry


REGISTRY = registry()


def data_of(field: str, value: Any) -> dict[str, Any]:
    return {} if value is MISSING else {field: value}


def run_event(run_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"name": "start", "data": data, "id": f"ev-{run_id}", "ts": 7}


def park(store: Store, kind: str, reply: str, condition: str, data: dict[str, Any]) -> str:
    """A queued run of ``f`` on ``data`` waiting (``kind`` 'event') for, or to be
    cancelled (``kind`` 'cancel') by, an event named ``reply`` with ``condition``."""
    run_id = f"r{next(_ids):06d}"

    def op(tx: Tx) -> None:
        seq = tx.insert_event(
            NewEvent(id=f"ev-{run_id}", name="start", data=json.dumps(data), ts=7, received_at=NOW)
        )
        tx.create_run(
            NewRun(
                id=run_id,
                function_id="f",
                event_seqs=[seq],
                event_ids=[f"ev-{run_id}"],
                available_at=NOW,
                created_at=NOW,
            )
        )
        if kind == "event":
            tx.save_steps(
                [
                    StepRow(
                        run_id=run_id,
                        step_id="w",
                        position=0,
                        kind=StepKind.WAIT,
                        status=StepStatus.WAITING,
                        started_at=NOW,
                    )
                ],
                [],
            )
        tx.insert_wait(
            build_wait(
                run_id=run_id,
                step_id="w",
                kind=WaitKind(kind),
                event_name=reply,
                condition=condition,
                run_event=run_event(run_id, data),
                now=NOW,
                expires_at=None,
                field="if_",
            )
        )

    store.transact_sync(op)
    return run_id


def deliver(store: Store, reply: str, data: dict[str, Any]) -> None:
    store.transact_sync(lambda tx: ingest(tx, prepare(ss.Event(reply, data), NOW), REGISTRY, NOW))


def resolved(store: Store, kind: str, run_id: str) -> bool:
    def op(tx: Tx) -> bool:
        if kind == "event":
            step = tx.get_step(run_id, "w")
            return step is not None and step.status == StepStatus.COMPLETED
        run = tx.get_run(run_id)
        return run is not None and run.status == RunStatus.CANCELLED

    return store.read_sync(op)


def cel_says(condition: str, waiting: dict[str, Any], incoming: dict[str, Any]) -> bool:
    """The oracle: the condition evaluated with CEL itself (an error is false)."""
    scope = {
        "event": {"name": "start", "data": waiting, "id": "w", "ts": 7},
        "async": {"name": "reply", "data": incoming, "id": "a", "ts": 8},
    }
    try:
        return cel.compile(condition).execute(scope) is True
    except Exception:  # noqa: BLE001 - any evaluation error makes the condition false
        return False


def engine_says(store: Store, kind: str, condition: str, waiting: Any, incoming: Any) -> bool:
    reply = f"reply-{next(_ids)}"  # a name of its own: no other example's waits
    run_id = park(store, kind, reply, condition, data_of("y", waiting))
    deliver(store, reply, data_of("x", incoming))
    return resolved(store, kind, run_id)


EQUALITY = "async.data.x == event.data.y"
KINDS = ("event", "cancel")


# -- the instances the review found ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_field_matches_no_missing_field(store: Store, kind: str) -> None:
    assert not engine_says(store, kind, EQUALITY, MISSING, MISSING)
    assert not engine_says(store, kind, EQUALITY, None, MISSING)
    assert not engine_says(store, kind, EQUALITY, MISSING, None)
    assert engine_says(store, kind, EQUALITY, None, None)  # both present and null: CEL says equal


@pytest.mark.parametrize("kind", KINDS)
def test_numbers_cel_calls_equal_match(store: Store, kind: str) -> None:
    assert engine_says(store, kind, EQUALITY, 1, 1.0)
    assert engine_says(store, kind, "event.data.y == async.data.x", 2.0, 2)
    assert engine_says(store, kind, EQUALITY, {"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert engine_says(store, kind, EQUALITY, 2**53 + 1, float(2**53))  # CEL compares as doubles
    assert not engine_says(store, kind, EQUALITY, True, 1)  # CEL: a bool is no number
    assert not engine_says(store, kind, EQUALITY, 1, 2)


def test_cancel_on_through_send_ignores_events_lacking_the_field(make_app: Callable[..., ss.App]) -> None:
    app = make_app()
    app.function(
        id="trial",
        trigger=ss.on_event("trial.started"),
        cancel_on=[ss.CancelOn(event="user.deleted", if_="async.data.user == event.data.user")],
    )(lambda ctx: None)
    [no_user] = app.send(ss.Event("trial.started", {}))
    [numbered] = app.send(ss.Event("trial.started", {"user": 7}))
    runs = {e: app.runs.list(event_id=e)[0].id for e in (no_user, numbered)}
    app.send(ss.Event("user.deleted", {"reason": "unrelated"}))
    assert app.runs.get(runs[no_user]).status == "queued"
    app.send(ss.Event("user.deleted", {"user": 7.0}))
    assert app.runs.get(runs[numbered]).status == "cancelled"
    assert app.runs.get(runs[no_user]).status == "queued"


MEMBERSHIP = "event.data.y in async.data.x"


def test_a_membership_is_indexed_and_an_equality_preferred() -> None:
    def key_of(condition: str) -> str:
        wait = build_wait(
            run_id="r",
            step_id="w",
            kind=WaitKind.EVENT,
            event_name="reply",
            condition=condition,
            run_event=run_event("r", {"y": 1, "z": 2}),
            now=NOW,
            expires_at=None,
            field="if_",
        )
        return f"{wait.match_key}={wait.match_value}"

    assert key_of(MEMBERSHIP) == "in:x=1"
    assert key_of(f"true && {MEMBERSHIP}") == "in:x=1"
    assert key_of(f"{MEMBERSHIP} && async.data.k == event.data.z") == "k=2"  # one probe, not one per element
    assert key_of("async.data.x in event.data.y") == "has:x=!missing"  # the run's 1 is no list: CEL errs


def key_of(condition: str, data: dict[str, Any]) -> tuple[str, tuple[str, ...], float | None]:
    wait = build_wait(
        run_id="r",
        step_id="w",
        kind=WaitKind.EVENT,
        event_name="reply",
        condition=condition,
        run_event=run_event("r", data),
        now=NOW,
        expires_at=None,
        field="if_",
    )
    return wait.match_key, (wait.match_value, *wait.also_match), wait.match_number


def test_prefixes_reverse_memberships_and_comparisons_are_indexed() -> None:
    assert key_of("async.data.x in event.data.y", {"y": [2, 1.0, 2.0]}) == ("has:x", ("1", "2"), None)
    assert key_of("async.data.x in event.data.y", {"y": {"a": 1}}) == ("has:x", ('"a"',), None)
    assert key_of("async.data.x.startsWith(event.data.y)", {"y": "ab"}) == ("prefix:x", ('"ab"',), None)
    assert key_of("event.data.y.startsWith(async.data.x)", {"y": "ab"}) == (
        "starts:x",
        ('""', '"a"', '"ab"'),
        None,
    )
    between = "async.data.x > event.data.y && async.data.x < event.data.y + 1"
    assert key_of(between, {"y": 3}) == ("range:x|-1.0|0.0", ("",), 3.0)
    assert key_of("event.data.y - 2 >= async.data.x", {"y": 5}) == ("range:x|2.0|", ("",), 5.0)
    # what CEL would reject matches nothing; what needs too many rows or probes is unindexed
    assert key_of("async.data.x in event.data.y", {"y": "abc"}) == ("has:x", ("!missing",), None)
    assert key_of("async.data.x in event.data.y", {"y": list(range(65))}) == ("", ("",), None)
    assert key_of("async.data.x.startsWith(event.data.y)", {"y": "a" * 64}) == ("", ("",), None)
    assert key_of("event.data.y.startsWith(async.data.x)", {"y": 7}) == ("starts:x", ("!missing",), None)
    assert key_of("async.data.x < event.data.y", {"y": "b"}) == ("", ("",), None)  # strings compare too
    assert key_of("async.data.x < event.data.y", {"y": True}) == ("", ("",), None)
    # an operand of || or ?: is no conjunct
    assert key_of("async.data.x == event.data.y || true", {"y": 1}) == ("", ("",), None)


@pytest.mark.parametrize("kind", KINDS)
def test_long_lists_and_strings_fall_back_to_evaluation(store: Store, kind: str) -> None:
    assert engine_says(store, kind, "async.data.x in event.data.y", list(range(100)), 99)
    assert not engine_says(store, kind, "async.data.x in event.data.y", list(range(100)), 100)
    assert engine_says(store, kind, "async.data.x.startsWith(event.data.y)", "a" * 70, "a" * 80)
    assert engine_says(store, kind, "event.data.y.startsWith(async.data.x)", "b" * 70, "b" * 65)
    assert engine_says(store, kind, "async.data.x < event.data.y", "b", "a")


def test_an_unindexed_condition_is_logged_once_per_text(caplog: pytest.LogCaptureFixture) -> None:
    condition = f"async.data.x.endsWith(event.data.y) && {next(_ids)} > 0"
    with caplog.at_level(logging.WARNING, logger="stepstone.waits"):
        for _ in range(3):
            key_of(condition, {"y": "z"})
        key_of("async.data.x.startsWith(event.data.y)", {"y": "z"})
    assert [r.getMessage() for r in caplog.records if condition in r.getMessage()] == [
        f"event wait condition if_ {condition!r} has no indexed shape: every event of its name "
        "evaluates it on every waiting run (cost linear in waits; indexed: ==, in, startsWith and <, "
        "<=, >, >= between an async.data and an event.data field, joined by &&)"
    ]
    assert len(caplog.records) == 1


def test_cancel_on_warns_at_decoration_when_its_condition_is_unindexed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    condition = f"async.data.user.lowerAscii() == event.data.user && {next(_ids)} > 0"
    app = ss.App("warned", database_url="sqlite:///never-opened.db")
    with caplog.at_level(logging.WARNING, logger="stepstone.waits"):
        app.function(id="f", cancel_on=[ss.CancelOn(event="gone", if_=condition)])(lambda ctx: None)
        app.function(id="g", cancel_on=[ss.CancelOn(event="gone", if_=condition)])(lambda ctx: None)
        app.function(id="h", cancel_on=[ss.CancelOn(event="gone", if_="async.data.u == event.data.u")])(
            lambda ctx: None
        )
    [record] = caplog.records
    assert "cancel_on[0].if_" in record.getMessage() and condition in record.getMessage()


@pytest.mark.parametrize("kind", KINDS)
def test_a_membership_matches_elements_and_map_keys_as_cel_does(store: Store, kind: str) -> None:
    assert engine_says(store, kind, MEMBERSHIP, 2, [1, 2.0, 3])
    assert engine_says(store, kind, MEMBERSHIP, "b", {"a": 1, "b": 2})
    assert engine_says(store, kind, MEMBERSHIP, [1], [[1.0], 2])
    assert not engine_says(store, kind, MEMBERSHIP, 4, [1, 2, 3])
    assert not engine_says(store, kind, MEMBERSHIP, 1, {"1": 1})  # a map's keys are strings here
    assert not engine_says(store, kind, MEMBERSHIP, True, [1])  # CEL: a bool is no number
    assert not engine_says(store, kind, MEMBERSHIP, "a", "abc")  # not a list or map: CEL errs
    assert not engine_says(store, kind, MEMBERSHIP, 1, MISSING)
    assert not engine_says(store, kind, MEMBERSHIP, MISSING, [1])


def test_an_event_listing_many_waits_resolves_each_once(store: Store) -> None:
    reply = f"reply-{next(_ids)}"
    runs = {y: park(store, "event", reply, MEMBERSHIP, {"y": y}) for y in range(5)}
    deliver(store, reply, {"x": [0, 1, 1.0, 3, 9]})
    assert {y for y, run_id in runs.items() if resolved(store, "event", run_id)} == {0, 1, 3}
    deliver(store, reply, {"x": [2, 4]})
    assert all(resolved(store, "event", run_id) for run_id in runs.values())


# -- the class: the engine agrees with CEL on every pair of values ---------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.sampled_from(
        [
            0,
            1,
            -1,
            2**53,
            2**53 + 1,
            2**63 - 1,
            2**63,
            2**64 + 1,
            0.0,
            -0.0,
            1.0,
            9007199254740992.0,
            1e300,
            True,
            False,
            "1",
            "",
            "null",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "1"]), inner, max_size=3)
    ),
    max_leaves=6,
)
MAYBE = st.one_of(st.just(MISSING), VALUES)


def twin(value: Any) -> Any:
    """``value`` with ints and integral floats swapped (equal in CEL)."""
    if isinstance(value, bool) or value is MISSING:
        return value
    if isinstance(value, int) and abs(value) <= 2**53:
        return float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [twin(v) for v in value]
    if isinstance(value, dict):
        return {k: twin(v) for k, v in value.items()}
    return value


PAIRS = st.one_of(
    st.tuples(MAYBE, MAYBE),
    MAYBE.map(lambda v: (v, v)),
    MAYBE.map(lambda v: (v, twin(v))),
    st.tuples(VALUES, st.lists(VALUES, max_size=2)).map(lambda p: (p[0], [*p[1], twin(p[0])])),
    st.tuples(st.sampled_from(["a", "1", 1]), VALUES).map(lambda p: (p[0], {"a": p[1], "1": p[1]})),
)
CONDITIONS = st.sampled_from(
    [EQUALITY, "event.data.y == async.data.x", "async.data.x == event.data.y && true", MEMBERSHIP]
)
NUMBERS = st.one_of(
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False),
    st.sampled_from([0, 1, -1, 0.5, 2**53, 2**53 + 1, 2**63, 1e300, -0.0]),
)
# Pairs near each shape's boundary: a list holding the incoming value, strings one
# the other's prefix, numbers a small step apart (and whatever else VALUES gives).
SHAPED_PAIRS = st.one_of(
    PAIRS,
    st.tuples(VALUES, st.lists(VALUES, max_size=3)).map(lambda p: ([*p[1], twin(p[0])], p[0])),
    st.tuples(st.text(max_size=3), st.text(max_size=3)).map(lambda p: (p[0], p[0] + p[1])),
    st.tuples(st.text(max_size=3), st.text(max_size=3)).map(lambda p: (p[0] + p[1], p[0])),
    st.tuples(NUMBERS, st.sampled_from([-2.5, -1, -0.5, 0, 0.5, 1, 2.5, 3])).map(
        lambda p: (p[0], p[0] + p[1]) if abs(p[0]) < 1e300 else p
    ),
    st.tuples(NUMBERS, NUMBERS),
)
SHAPED_CONDITIONS = st.sampled_from(
    [
        "async.data.x in event.data.y",  # the run's list or map holds the incoming value
        "async.data.x.startsWith(event.data.y)",  # the run's string prefixes the incoming one
        "event.data.y.startsWith(async.data.x)",  # the incoming string prefixes the run's
        "async.data.x > event.data.y",
        "event.data.y >= async.data.x",
        "async.data.x <= event.data.y && async.data.x > event.data.y - 1",
        "event.data.y + 2.5 > async.data.x && event.data.y - 0.5 <= async.data.x",
        "async.data.x + 1 < event.data.y + 3",
    ]
)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    opened = make_store(f"sqlite:///{tmp_path}/matching.db")
    opened.migrate()
    yield opened
    opened.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=PAIRS, condition=CONDITIONS, kind=st.sampled_from(KINDS))
def test_the_engine_resolves_a_wait_iff_cel_says_the_condition_holds(
    sqlite_store: Store, pair: tuple[Any, Any], condition: str, kind: str
) -> None:
    waiting, incoming = pair
    expected = cel_says(condition, data_of("y", waiting), data_of("x", incoming))
    assert engine_says(sqlite_store, kind, condition, waiting, incoming) == expected, (waiting, incoming)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=SHAPED_PAIRS, condition=SHAPED_CONDITIONS)
def test_prefix_reverse_membership_and_range_indexes_agree_with_cel(
    store: Store, pair: tuple[Any, Any], condition: str
) -> None:
    waiting, incoming = pair
    expected = cel_says(condition, data_of("y", waiting), data_of("x", incoming))
    assert engine_says(store, "event", condition, waiting, incoming) == expected, (waiting, incoming)


# -- waits parked by earlier versions --------------------------------------------------------------


def park_legacy(store: Store, reply: str, match_value: str) -> str:
    """A wait as versions before 0012_cel wrote it for ``async.data.x ==
    event.data.y``: the plain JSON of ``y`` as the index value, no expression."""
    run_id = park(store, "event", f"unused-{next(_ids)}", EQUALITY, {})
    legacy = WaitRow(
        run_id=run_id,
        step_id="w",
        kind=WaitKind.EVENT,
        event_name=reply,
        match_key="x",
        match_value=match_value,
        created_at=NOW,
    )

    def replace(tx: Tx) -> None:  # one wait per step: the legacy row takes the new one's place
        tx.delete_run_waits(run_id)
        tx.insert_wait(legacy)

    store.transact_sync(replace)
    return run_id


def test_waits_parked_before_the_upgrade_still_match(store: Store, db_url: str) -> None:
    floats = {
        value: park_legacy(store, f"legacy-{i}", value)
        for i, value in enumerate(["1.0", "-3.0", "-0.0", "2.5", '"1.0"', "[1.0]"])
    }
    rerun_migration(db_url, "0012_cel")
    store.migrate()
    for i, (value, run_id) in enumerate(floats.items()):
        deliver(store, f"legacy-{i}", {"x": json.loads(value)})
        assert resolved(store, "event", run_id) == (value != "[1.0]"), value  # scalars are rewritten


def rerun_migration(db_url: str, name: str) -> None:
    """Forget that ``name`` was applied, so that ``migrate`` applies it again."""
    if db_url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute("DELETE FROM schema_migrations WHERE name = ?", (name,))
        return
    import psycopg

    with psycopg.connect(db_url) as pg:
        pg.execute("DELETE FROM schema_migrations WHERE name = %s", (name,))


@pytest.mark.parametrize(
    "condition",
    [
        "async.data.x == event.data.y && false || true",  # (a && false) || true: always true
        "async.data.x == event.data.y && false ? false : true",  # a ternary over the conjunction
    ],
)
def test_a_conjunction_under_an_or_or_a_ternary_is_not_indexed(store: Store, condition: str) -> None:
    assert cel_says(condition, {"y": 1}, {"x": 2})
    assert engine_says(store, "event", condition, 1, 2)


# -- unindexed waits evaluated before the write transaction -----------------------------------------

LINEAR = "async.data.x.endsWith(event.data.y)"  # no indexed shape


def surveyed(store: Store, reply: str, data: dict[str, Any]) -> tuple[PreparedEvent, Survey | None]:
    """The survey a send makes before its write transaction (a read of its own)."""
    [event] = prepare(ss.Event(reply, data), NOW)
    return event, store.read_sync(lambda tx: survey(tx, reply, event.variables, NOW, lambda *_: None))


def deliver_surveyed(store: Store, event: PreparedEvent, found: Survey | None) -> list[int]:
    counts: list[int] = []
    surveys = {} if found is None else {event.id: found}
    learn = lambda name, n: counts.append(n)  # noqa: E731 - the unindexed waits read inside the transaction
    store.transact_sync(lambda tx: ingest(tx, [event], REGISTRY, NOW, surveys, learn))
    return counts


def test_a_survey_resolves_the_waits_an_in_transaction_match_would(store: Store) -> None:
    reply = f"reply-{next(_ids)}"
    runs = {y: park(store, "event", reply, LINEAR, {"y": y}) for y in ("a", "b", "ab", "c")}
    event, found = surveyed(store, reply, {"x": "zab"})
    assert found is not None and {w.run_id for w in found.matched} == {runs["b"], runs["ab"]}
    assert deliver_surveyed(store, event, found) == []  # nothing evaluated in the write transaction
    assert {y for y, run_id in runs.items() if resolved(store, "event", run_id)} == {"b", "ab"}


def test_waits_created_or_gone_between_the_survey_and_the_write_are_honoured(store: Store) -> None:
    """The race the survey opens: a wait committed after it is evaluated in the
    write transaction (once); a surveyed wait resolved meanwhile is not
    resolved again; a key row pruned and re-created means a full evaluation."""
    reply = f"reply-{next(_ids)}"
    early, gone = (
        park(store, "event", reply, LINEAR, {"y": "1"}),
        park(store, "event", reply, LINEAR, {"y": "1"}),
    )
    event, found = surveyed(store, reply, {"x": "01"})
    assert found is not None and len(found.matched) == 2
    late = park(store, "event", reply, LINEAR, {"y": "01"})  # committed after the survey
    late_other = park(store, "event", reply, LINEAR, {"y": "2"})
    store.transact_sync(lambda tx: tx.claim_step_waits(gone, "w"))  # resolved by something else meanwhile
    assert deliver_surveyed(store, event, found) == []
    assert [resolved(store, "event", r) for r in (early, gone, late, late_other)] == [
        True,
        False,
        True,
        False,
    ]

    reply = f"reply-{next(_ids)}"
    first = park(store, "event", reply, LINEAR, {"y": "1"})
    event, found = surveyed(store, reply, {"x": "1"})
    store.transact_sync(lambda tx: tx.claim_step_waits(first, "w"))
    assert store.transact_sync(lambda tx: tx.prune_wait_keys(1000)) >= 1  # the key, unused, goes
    again = park(store, "event", reply, LINEAR, {"y": "1"})  # re-creates it: versions start over
    assert deliver_surveyed(store, event, found) == [1]  # evaluated here, in full
    assert resolved(store, "event", again)


def test_a_send_surveys_a_name_with_many_unindexed_waits_outside_its_write_transaction(
    store: Store, db_url: str
) -> None:
    reply = f"reply-{next(_ids)}"
    app = ss.App("surveying", database_url=db_url)
    try:
        for y in range(SURVEY_AT):
            park(store, "event", reply, LINEAR, {"y": f"-{y}"})
        app.send(ss.Event(reply, {"x": "nothing"}))  # evaluated in its transaction: the name is learnt
        assert app._surveyed.wanted(reply)
        matching = park(store, "event", reply, LINEAR, {"y": "!"})
        with faults.recording() as seen:
            app.send(ss.Event(reply, {"x": "yes!"}))
        assert resolved(store, "event", matching)
        assert seen.sites == ["App._send.op"]  # one write transaction
    finally:
        app.close()
