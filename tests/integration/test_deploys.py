"""Deploys that rename or drop functions: the functions no live app registers
any more are retired (issue 12 defect 8).

When an app's worker registers its functions, the functions that app
registered before and no longer has are marked retired: events stop starting
runs of them, while workers still running the old code drain the runs they
host. Operators see retired functions (``stepstone functions``, ``GET
/api/v1/functions``) and drain their queued runs with ``cancel_many``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.inventory import list_functions


def _deploy(make_app: Callable[..., ss.App], *function_ids: str) -> ss.App:
    app = make_app("mail")
    for function_id in function_ids:
        app.function(id=function_id, trigger=ss.on_event("user.created"))(lambda ctx: ctx.function_id)
    return app


def _retired(app: ss.App) -> dict[str, bool]:
    return {f.id: f.retired_at is not None for f in app.store.read_sync(list_functions)}


def test_a_renamed_function_is_retired_and_its_old_runs_drain(make_app: Callable[..., ss.App]) -> None:
    old = _deploy(make_app, "welcome-email")
    old_worker = old.worker(instance_id="old")  # the old deploy, still alive
    [before] = old.send(ss.Event("user.created"))

    new = _deploy(make_app, "welcome-email-v2")
    new.start(instance_id="new")
    sender = make_app("web")  # a process that only sends (no functions of its own)
    [after] = sender.send(ss.Event("user.created"))
    assert [r.function_id for r in sender.runs.list(event_id=after)] == ["welcome-email-v2"]
    assert _retired(sender) == {"welcome-email": True, "welcome-email-v2": False}

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(old_worker.drain())  # old workers still run what they host
    finally:
        loop.close()
    [old_run] = sender.runs.list(event_id=before, function_id="welcome-email")
    assert sender.runs.get(old_run.id).status == "completed"


def test_queued_runs_of_a_retired_function_are_seen_and_cancelled(make_app: Callable[..., ss.App]) -> None:
    old = _deploy(make_app, "welcome-email")
    old.send([ss.Event("user.created"), ss.Event("user.created")])
    _deploy(make_app, "welcome-email-v2").worker()  # the new deploy's worker registers
    app = make_app("ops")
    queued = app.runs.list(function_id="welcome-email", status="queued")
    assert len(queued) == 2
    assert app.runs.cancel_many(function_id="welcome-email") == 2
    assert app.runs.list(function_id="welcome-email", status="queued") == []


def test_registering_a_retired_function_again_brings_it_back(make_app: Callable[..., ss.App]) -> None:
    _deploy(make_app, "welcome-email").worker()
    _deploy(make_app, "welcome-email-v2").worker()
    rollback = _deploy(make_app, "welcome-email")
    rollback.worker()  # a rollback: the old code is deployed again
    assert _retired(rollback) == {"welcome-email": False, "welcome-email-v2": True}
    [event_id] = make_app("web").send(ss.Event("user.created"))
    assert [r.function_id for r in rollback.runs.list(event_id=event_id)] == ["welcome-email"]


def test_an_app_without_functions_retires_nothing(make_app: Callable[..., ss.App]) -> None:
    _deploy(make_app, "welcome-email").worker()
    make_app("mail").worker()  # e.g. a sending process of the same app, no functions imported
    assert _retired(make_app("ops")) == {"welcome-email": False}


POOL = ("a", "b", "c", "d")
deploys = st.lists(
    st.tuples(st.sampled_from(["mail", "billing"]), st.sets(st.sampled_from(POOL), max_size=3)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=deploys)
def test_after_any_sequence_of_deploys_events_reach_exactly_the_deployed_functions(
    history: list[tuple[str, set[str]]],
) -> None:
    """The class of defect 8: whatever each deploy of two apps adds, renames or
    drops, an event from a process without functions starts runs of exactly
    the functions in each app's latest non-empty deploy (a function moved to
    the other app follows it), and every other registered function is listed
    as retired."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/s.db"
        latest: dict[str, set[str]] = {}
        owner: dict[str, str] = {}
        for i, (name, functions) in enumerate(history):
            deploy = ss.App(name, database_url=url)
            for function_id in sorted(functions):
                deploy.function(
                    id=f"{name}-{function_id}" if i % 2 else function_id, trigger=ss.on_event("go")
                )(lambda ctx: None)
            deploy.worker()
            deployed = set(deploy.registry.ids())
            if deployed:
                latest[name] = deployed
                for function_id in deployed:
                    for other, ids in latest.items():
                        if other != name:
                            ids.discard(function_id)  # it moved to this app
                    owner[function_id] = name
            deploy.close()
        live = set().union(*latest.values()) if latest else set()
        sender = ss.App("web", database_url=url)
        try:
            [event_id] = sender.send(ss.Event("go"))
            assert {r.function_id for r in sender.runs.list(event_id=event_id)} == live
            listed = {f.id: f.retired_at is None for f in sender.store.read_sync(list_functions)}
            assert listed == {function_id: function_id in live for function_id in owner}
        finally:
            sender.close()
