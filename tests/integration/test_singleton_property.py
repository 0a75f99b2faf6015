"""The singleton invariant under any sequence of ways a run becomes active or
ends: events (``skip`` and ``cancel`` modes), replay, ``rerun_from``,
``replay_many``, cancellation and failure. At every point a key has at most one
active run, and that run holds the key. Driven through the store operations
with explicit times (no workers), on SQLite; the same operations run on both
stores in ``test_orchestration.py``.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.actions import replay_op, rerun_op
from stepstone.bulk import bulk_action
from stepstone.errors import ErrorInfo, InvalidStateError
from stepstone.registry import Registry
from stepstone.runtime import cancel_run, end_run, ingest, prepare
from stepstone.store import make_store
from stepstone.store.base import Store, Tx
from stepstone.store.rows import ACTIVE_STATUSES, RunFilter, RunStatus, StepKind, StepRow, StepStatus

NOW = 1_000_000.0

actions = st.lists(
    st.tuples(
        st.sampled_from(["send", "fail", "cancel", "complete", "replay", "rerun", "replay_many"]),
        st.integers(min_value=0, max_value=1),  # the key (for send)
        st.integers(min_value=0, max_value=20),  # which run (for the others)
    ),
    min_size=1,
    max_size=25,
)


def _registry(mode: Literal["skip", "cancel"]) -> Registry:
    app = ss.App("singles", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="one", trigger=ss.on_event("go"), singleton=ss.Singleton(key="event.data.k", mode=mode))(
        lambda ctx: None
    )
    return app.registry


def _runs(tx: Tx) -> list[Any]:
    return sorted(tx.list_runs(RunFilter(function_id="one", limit=500)), key=lambda r: r.id)


def _act(store: Store, registry: Registry, action: str, key: int, pick: int, now: float) -> None:
    runs = store.read_sync(_runs)
    chosen = runs[pick % len(runs)] if runs else None
    if action == "send":
        prepared = prepare(ss.Event("go", {"k": key}), now)
        store.transact_sync(lambda tx: ingest(tx, prepared, registry, now))
    elif chosen is None:
        return
    elif action in ("fail", "complete") and chosen.status in ACTIVE_STATUSES:
        status = RunStatus.FAILED if action == "fail" else RunStatus.COMPLETED
        error = ErrorInfo("Boom", "failed") if action == "fail" else None

        def finish(tx: Tx) -> None:
            # A run's first step, so it can be re-run from.
            tx.save_steps(
                [
                    StepRow(
                        run_id=chosen.id,
                        step_id="s",
                        position=0,
                        kind=StepKind.RUN,
                        status=StepStatus.COMPLETED,
                        attempts=1,
                        output="1",
                        error=None,
                        wake_at=None,
                        started_at=now,
                        ended_at=now,
                    )
                ],
                [],
            )
            end_run(tx, chosen, status, None, error, now, registry)

        store.transact_sync(finish)
    elif action == "cancel":
        store.transact_sync(lambda tx: cancel_run(tx, chosen.id, now, registry))
    elif action == "replay" and chosen.status in ("failed", "cancelled"):
        try:
            store.transact_sync(replay_op(chosen.id, now))
        except InvalidStateError:
            pass
    elif action == "rerun" and chosen.status == RunStatus.COMPLETED:
        try:
            store.transact_sync(rerun_op(chosen.id, "s", now))
        except InvalidStateError:
            pass
    elif action == "replay_many":
        bulk = bulk_action(
            "replay",
            now,
            registry,
            function_id="one",
            status=("failed", "cancelled"),
            since=None,
            until=None,
            if_=None,
        )
        while not bulk.finished:
            store.transact_sync(bulk.page_op())


def _check(store: Store) -> None:
    def op(tx: Tx) -> tuple[list[Any], dict[str, str | None]]:
        runs = _runs(tx)
        keys = {r.singleton_key for r in runs if r.singleton_key}
        return runs, {key: tx.claim_key(key, "probe", NOW * 10, 0.0) for key in keys}

    # claim_key inside a read-only transaction would write: read the holders in a
    # transaction that is rolled back by raising.
    runs, holders = _read_rolled_back(store, op)
    active = Counter(r.singleton_key for r in runs if r.status in ACTIVE_STATUSES)
    assert all(n <= 1 for n in active.values()), [(r.id, r.status, r.singleton_key) for r in runs]
    for run in runs:
        if run.status in ACTIVE_STATUSES and run.singleton_key:
            assert holders[run.singleton_key] == run.id, (run, holders)


class _Rollback(Exception):
    pass


def _read_rolled_back(store: Store, op: Any) -> Any:
    box: list[Any] = []

    def run(tx: Tx) -> None:
        box.append(op(tx))
        raise _Rollback

    try:
        store.transact_sync(run)
    except _Rollback:
        pass
    return box[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["skip", "cancel"]), history=actions)
def test_a_singleton_key_never_has_two_active_runs(
    mode: Literal["skip", "cancel"], history: list[tuple[str, int, int]]
) -> None:
    registry = _registry(mode)
    with tempfile.TemporaryDirectory() as folder:
        store = make_store(f"sqlite:///{folder}/s.db")
        store.migrate()
        try:
            for i, (action, key, pick) in enumerate(history):
                _act(store, registry, action, key, pick, NOW + i)
                _check(store)
        finally:
            store.close()
