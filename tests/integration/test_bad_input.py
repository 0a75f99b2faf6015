"""Bad input never blocks good input: an expression that fails at runtime over
one event's data is false (a condition) or null (a key) in every slot, and
nothing escapes from ``app.send``; event data nests at most 64 levels.

The table test registers one function per (slot, failing expression) and a
plain function beside them, then sends a batch: every event is recorded, every
function starts its runs, the plain one included.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.events import InvalidEventError
from stepstone.runtime import ingest, prepare
from stepstone.runtime.waits import build_wait
from stepstone.store.base import Store, Tx
from stepstone.store.rows import NewEvent, NewRun, RunFilter, StepKind, StepRow, StepStatus, WaitKind, WaitRow

from ..conftest import query

# Each fails at runtime over {"n": 1, "xs": [1]}: division by zero, modulo by
# zero, index out of range, a type error, a missing key, an int64 overflow, a
# failing conversion, a field of a number.
FAILING = [
    "1 / (event.data.n - 1)",
    "event.data.n % 0",
    "event.data.xs[5]",
    "event.data.n + 'a'",
    "event.data.nope",
    "event.data.n * int('46116860184' + '27387904') * 2",
    "int('x' + string(event.data.n))",
    "event.data.n.field",
]
CONDITIONS = [f"({expression}) == 1" for expression in FAILING]
# Keys may also evaluate to a value that is not JSON: null too.
KEYS = [*FAILING, "timestamp('2020-01-01T00:00:00Z')", "b'bytes'", "duration('1s')"]
DATA = {"n": 1, "xs": [1]}


def key_slots(key: str) -> dict[str, dict[str, Any]]:
    """Every flow-control option that takes a key, with ``key``."""
    return {
        "concurrency": {"concurrency": ss.Concurrency(limit=5, key=key)},
        "env-concurrency": {"concurrency": ss.Concurrency(limit=5, key=key, scope="env")},
        "throttle": {"throttle": ss.Throttle(limit=100, period="1s", key=key)},
        "rate-limit": {"rate_limit": ss.RateLimit(limit=100, period="1s", key=key)},
        "idempotency": {"idempotency": key},
        "singleton": {"singleton": ss.Singleton(key=key, mode="cancel")},
        "debounce": {"debounce": ss.Debounce(period="1s", key=key)},
        "batch": {"batch": ss.Batch(max_size=10, timeout="1s", key=key)},
        "priority": {"priority": ss.Priority(run=key)},
    }


def register_failing_slots(app: ss.App) -> list[str]:
    """Functions on "go" with a failing expression in each slot, and "plain";
    returns the ids of those that must start a run for every "go"."""
    every = ["plain"]
    app.function(id="plain", trigger=ss.on_event("go"))(lambda ctx: None)
    for i, condition in enumerate(CONDITIONS):
        app.function(id=f"trigger-{i}", trigger=ss.on_event("go", if_=condition))(lambda ctx: None)
        app.function(
            id=f"cancel-{i}",
            trigger=ss.on_event("go"),
            cancel_on=[ss.CancelOn(event="go", if_=f"async.data.n == 1 && {condition}")],
        )(lambda ctx: None)
        every.append(f"cancel-{i}")
    for i, key in enumerate(KEYS):
        for slot, options in key_slots(key).items():
            app.function(id=f"{slot}-{i}", trigger=ss.on_event("go"), **options)(lambda ctx: None)
            if slot not in ("singleton", "debounce", "batch"):
                every.append(f"{slot}-{i}")
    return every


def test_failing_expressions_in_every_slot_are_false_or_null(
    make_app: Callable[..., ss.App], caplog: pytest.LogCaptureFixture
) -> None:
    from stepstone import expressions

    expressions._last_logged.clear()  # failures logged by earlier tests are not logged again for a minute
    app = make_app()
    every = register_failing_slots(app)
    ids = app.send([ss.Event("go", DATA), ss.Event("go", DATA), ss.Event("other", {"fine": True})])
    assert len(ids) == 3
    runs: dict[str, set[str]] = {}
    for event_id in ids[:2]:
        for run in app.runs.list(event_id=event_id, limit=500):
            runs.setdefault(run.function_id, set()).add(run.id)
    started = {fn: len(ids) for fn, ids in runs.items()}
    assert {fn: started.get(fn) for fn in every} == {fn: 2 for fn in every}
    assert not any(fn.startswith("trigger-") for fn in started)  # a failing condition is false
    for i in range(len(KEYS)):  # a null key is one key: one debounce/batch run
        assert started[f"singleton-{i}"] == 2  # the second replaced the first
        assert started[f"debounce-{i}"] == 1 and started[f"batch-{i}"] == 1
    assert app.runs.list(function_id="cancel-0")[0].status == "queued"  # cancel_on never held
    warned = [r.getMessage() for r in caplog.records if r.name == "stepstone.expressions"]
    assert len(warned) == len(set(warned))  # each failing expression once, not once per event
    assert len(warned) == len(CONDITIONS) * 2 + len(KEYS), warned


def test_run_filters_that_fail_select_nothing_and_raise_nothing(app: ss.App) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    app.send([ss.Event("go", DATA), ss.Event("go", {"n": 1, "xs": [1, 2, 3, 4, 5, 6]})])
    for condition in CONDITIONS:
        assert app.runs.cancel_many(function_id="f", if_=condition) == 0, condition
        assert app.runs.replay_many(function_id="f", if_=condition) == 0, condition
    assert app.runs.cancel_many(function_id="f", if_="event.data.xs[5] == 6") == 1


NOW = 1_000_000.0


def park(store: Store, run_id: str, condition: str) -> None:
    def op(tx: Tx) -> None:
        seq = tx.insert_event(
            NewEvent(id=f"ev-{run_id}", name="start", data=json.dumps(DATA), ts=7, received_at=NOW)
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
        run_event = {"name": "start", "data": DATA, "id": f"ev-{run_id}", "ts": 7}
        tx.insert_wait(
            build_wait(
                run_id=run_id,
                step_id="w",
                kind=WaitKind.EVENT,
                event_name="reply",
                condition=condition,
                run_event=run_event,
                now=NOW,
                expires_at=None,
                field="if_",
            )
        )

    store.transact_sync(op)


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
def test_a_failing_wait_condition_blocks_no_other_event_of_its_name(store: Store, indexed: bool) -> None:
    app = ss.App("waits", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="f")(lambda ctx: None)
    app.function(id="g", trigger=ss.on_event("reply"))(lambda ctx: None)
    prefix = "async.data.n == event.data.n && " if indexed else ""
    for i, condition in enumerate(CONDITIONS):
        park(store, f"bad-{i}", prefix + condition.replace("event.data", "async.data"))
    park(store, "good", prefix + "async.data.ok == true")
    broken = WaitRow(
        run_id="bad-0",
        step_id="w",
        kind=WaitKind.EVENT,
        event_name="reply",
        expression="async.data.n ==",
        event_json="{}",
        created_at=NOW,
    )
    store.transact_sync(lambda tx: tx.insert_wait(broken))  # a condition this version cannot compile
    event = ss.Event("reply", {**DATA, "ok": True})
    store.transact_sync(lambda tx: ingest(tx, prepare(event, NOW), app.registry, NOW))

    def op(tx: Tx) -> tuple[list[str | None], int]:
        waiting = [f"bad-{i}" for i in range(len(CONDITIONS))] + ["good"]
        steps = [tx.get_step(run_id, "w") for run_id in waiting]
        return [s.status if s else None for s in steps], len(tx.list_runs(RunFilter(function_id="g")))

    statuses, triggered = store.read_sync(op)
    assert statuses == [StepStatus.WAITING] * len(CONDITIONS) + [StepStatus.COMPLETED]
    assert triggered == 1


def nested(depth: int) -> dict[str, Any]:
    """An object ``depth`` levels deep (``{}`` is 1), innermost a list."""
    value: Any = []
    for _ in range(depth - 1):
        value = {"a": value}
    return dict(value)


def test_event_data_nests_at_most_64_levels(app: ss.App, db_url: str) -> None:
    from stepstone.events import nesting_depth

    app.function(id="f", trigger=ss.on_event("deep"))(lambda ctx: None)
    assert nesting_depth(nested(64), 1000) == 64 and nesting_depth({"a": [1, {}]}, 1000) == 3
    [ok] = app.send(ss.Event("deep", nested(64)))
    assert len(app.runs.list(event_id=ok)) == 1
    for depth in (65, 900, 100_000):
        with pytest.raises(InvalidEventError, match="nested more than 64 levels"):
            app.send([ss.Event("deep", {"fine": 1}), ss.Event("deep", nested(depth))])
    assert query(db_url, "SELECT COUNT(*) FROM events")[0][0] == 1  # the lists were rejected whole


# -- the class: any data, through every slot -----------------------------------------------------

# Over arbitrary data these fail in every way CEL can (missing keys, type errors,
# division by zero, indexes out of range, overflow, bad conversions) or succeed.
DATA_DEPENDENT = [
    "event.data.a / event.data.b",
    "event.data.a % event.data.b",
    "event.data.a[event.data.b]",
    "event.data.a + event.data.b",
    "event.data.a * event.data.a * event.data.a",
    "int(event.data.a)",
    "event.data.a.b.c",
    "string(event.data.a) + event.data.b",
    "double(event.data.a) / 0.0",
]
COMMON = st.sampled_from(
    [
        0,
        1,
        -1,
        2,
        0.0,
        1.5,
        "",
        "x",
        "7",
        None,
        True,
        2**62,
        9223372036854775807,
        [],
        [0],
        {"b": 0},
        {"b": {"c": 1}},
    ]
)
JSON = st.recursive(
    st.one_of(
        COMMON,
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=4),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=8,
)
EVENT_DATA = st.one_of(
    st.fixed_dictionaries({"a": COMMON, "b": COMMON}),
    st.dictionaries(st.sampled_from("ab"), JSON, max_size=2),
)


def data_dependent_app(url: str) -> ss.App:
    app = ss.App("any-data", database_url=url)
    app.function(id="plain", trigger=ss.on_event("go"))(lambda ctx: None)
    app.function(id="good", trigger=ss.on_event("good"))(lambda ctx: None)
    for i, expression in enumerate(DATA_DEPENDENT):
        condition = f"({expression}) == 1"
        app.function(id=f"trigger-{i}", trigger=ss.on_event("go", if_=condition))(lambda ctx: None)
        app.function(
            id=f"cancel-{i}",
            trigger=ss.on_event("go"),
            cancel_on=[ss.CancelOn(event="go", if_=condition.replace("event.", "async."))],
        )(lambda ctx: None)
        for slot, options in key_slots(expression).items():
            app.function(id=f"{slot}-{i}", trigger=ss.on_event("go"), **options)(lambda ctx: None)
    return app


@pytest.fixture
def any_data_app(tmp_path: Path) -> Iterator[ss.App]:
    app = data_dependent_app(f"sqlite:///{tmp_path}/any.db")
    yield app
    app.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=EVENT_DATA, second=EVENT_DATA)
def test_no_event_data_fails_a_send_or_blocks_its_batch(
    any_data_app: ss.App, first: dict[str, Any], second: dict[str, Any]
) -> None:
    ids = any_data_app.send([ss.Event("go", first), ss.Event("good", {"ok": 1}), ss.Event("go", second)])
    for event_id in (ids[0], ids[2]):
        assert [r.function_id for r in any_data_app.runs.list(event_id=event_id, function_id="plain")] == [
            "plain"
        ]
    assert len(any_data_app.runs.list(event_id=ids[1], function_id="good")) == 1
