"""``on_nondeterminism="pause"``, the ``paused`` status and resume (issue 13,
points 4 and 5).

A run is left waiting by one ``App`` (code v1). Another ``App`` on the same
database, holding changed code, wakes it: with ``on_nondeterminism="pause"``
the run stops before the step its history does not hold, and stays out of the
queue until an operator resumes it under the code deployed by then. A ledger of
side effects proves which step functions ran, and how many times.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone.testing import TestEnv

from ..conftest import query
from ..polling import wait_for

Ledger = list[str]


def _record(ledger: Ledger, name: str) -> Callable[[], str]:
    def effect() -> str:
        ledger.append(name)
        return name

    effect.__qualname__ = f"effect_{name}"  # one fingerprint per step, the same in every version
    return effect


def v1(ctx: ss.Context, ledger: Ledger) -> str:
    ctx.step.run("charge", _record(ledger, "charge"))
    ctx.step.wait_for_event("hold", event="go-on", timeout="1h")
    return str(ctx.step.run("ship", _record(ledger, "ship")))


def v2_new_step(ctx: ss.Context, ledger: Ledger) -> str:
    ctx.step.run("charge", _record(ledger, "charge"))
    ctx.step.run("audit", _record(ledger, "audit"))  # inserted before the recorded wait
    ctx.step.wait_for_event("hold", event="go-on", timeout="1h")
    return str(ctx.step.run("ship", _record(ledger, "ship")))


def v2_kind_changed(ctx: ss.Context, ledger: Ledger) -> str:
    ctx.step.run("charge", _record(ledger, "charge"))
    ctx.step.run("hold", _record(ledger, "hold"))  # the wait became a step.run
    return str(ctx.step.run("ship", _record(ledger, "ship")))


def v2_parallel_new_steps(ctx: ss.Context, ledger: Ledger) -> str:
    ctx.step.run("charge", _record(ledger, "charge"))
    ctx.step.parallel(  # two new steps at once, before the recorded wait
        lambda: ctx.step.run("audit", _record(ledger, "audit")),
        lambda: ctx.step.run("notify", _record(ledger, "notify")),
    )
    ctx.step.wait_for_event("hold", event="go-on", timeout="1h")
    return str(ctx.step.run("ship", _record(ledger, "ship")))


def v3_fixed(ctx: ss.Context, ledger: Ledger) -> str:
    ctx.step.run("charge", _record(ledger, "charge"))
    ctx.step.wait_for_event("hold", event="go-on", timeout="1h")
    ctx.step.run("audit", _record(ledger, "audit"))  # the new step, after the recorded ones
    return str(ctx.step.run("ship", _record(ledger, "ship")))


Handler = Callable[[ss.Context, Ledger], str]


def _deploy(
    make_app: Callable[..., ss.App],
    version: str,
    handler: Handler,
    ledger: Ledger,
    fn_options: dict[str, Any] | None = None,
    **options: Any,
) -> ss.App:
    app = make_app("shop", app_version=version, **options)

    @app.function(id="order", trigger=ss.on_event("order"), retries=0, **(fn_options or {}))
    def order(ctx: ss.Context) -> str:
        return handler(ctx, ledger)

    app.start()
    return app


def _waiting_runs(
    make_app: Callable[..., ss.App], ledger: Ledger, count: int = 1, fn_options: dict[str, Any] | None = None
) -> list[str]:
    """Runs of v1, each waiting for "go-on" after its charge; v1's workers stopped."""
    old = _deploy(make_app, "v1", v1, ledger, fn_options)
    ids = [old.runs.list(event_id=e)[0].id for e in old.send([ss.Event("order")] * count)]
    for run_id in ids:
        wait_for(_is_waiting(old, run_id), 10, "the v1 run to wait")
    old.stop()
    return ids


def _pauses(app: ss.App, run_id: str) -> list[dict[str, Any]]:
    return [s.detail for s in app.runs.trace(run_id) if s.kind == "warning" and s.name == "paused"]


def _paused(app: ss.App, run_id: str, times: int) -> None:
    wait_for(
        lambda: app.runs.get(run_id).status == "paused" and len(_pauses(app, run_id)) == times,
        10,
        f"the run to pause ({times})",
    )


def test_a_new_step_pauses_the_run_until_resumed_under_fixed_code(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    broken = _deploy(make_app, "v2", v2_new_step, ledger, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)

    assert ledger == ["charge"]  # the inserted step's function never ran
    assert _pauses(broken, run_id) == [{"reason": "new-step", "step_id": "audit", "missing": ["hold"]}]
    run = broken.runs.get(run_id)
    assert run.app_version == "v2" and not run.ended
    assert [r.id for r in broken.runs.list(status="paused")] == [run_id]
    assert [r.id for r in broken.runs.list(app_version="v2")] == [run_id]
    assert broken.runs.list(app_version="v1") == []
    # Out of the queue: no lease, no slot, nothing for maintenance to re-queue.
    assert query(db_url, f"SELECT COUNT(*) FROM queue WHERE run_id = '{run_id}'") == [(0,)]

    broken.runs.resume(run_id)  # the code still diverges: it pauses again
    _paused(broken, run_id, 2)
    assert ledger == ["charge"]
    with pytest.raises(ss.InvalidStateError):
        broken.runs.replay(run_id)
    broken.stop()

    fixed = _deploy(make_app, "v3", v3_fixed, ledger)
    fixed.runs.resume(run_id)
    done = fixed.runs.wait(run_id, timeout="10s")
    assert done.status == "completed" and done.output == "ship"
    assert ledger == ["charge", "audit", "ship"]  # no completed step ran again
    assert done.app_version == "v3"
    assert [s.kind for s in fixed.runs.trace(run_id)].count("resume") == 2
    with pytest.raises(ss.InvalidStateError):
        fixed.runs.resume(run_id)


def test_no_parallel_branch_executes_a_new_step_once_the_run_diverged(
    make_app: Callable[..., ss.App],
) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    broken = _deploy(make_app, "v2", v2_parallel_new_steps, ledger, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)  # one divergence traced, however many branches met it
    assert ledger == ["charge"]
    assert _pauses(broken, run_id)[0]["missing"] == ["hold"]


def test_an_async_handler_pauses_too(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    broken = make_app("shop", app_version="v2", on_nondeterminism="pause")

    @broken.function(id="order", trigger=ss.on_event("order"), retries=0)
    async def order(ctx: ss.Context) -> str:
        await ctx.step.run("charge", _record(ledger, "charge"))
        await ctx.step.run("audit", _record(ledger, "audit"))
        await ctx.step.wait_for_event("hold", event="go-on", timeout="1h")
        return str(await ctx.step.run("ship", _record(ledger, "ship")))

    broken.start()
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)
    assert ledger == ["charge"]


def test_a_changed_step_kind_pauses_the_run_too(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    broken = make_app("shop", app_version="v2", on_nondeterminism="pause")

    @broken.function(id="order", trigger=ss.on_event("order"), retries=0)
    def order(ctx: ss.Context) -> str:
        return v2_kind_changed(ctx, ledger)

    broken.start()
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)
    assert ledger == ["charge"]
    assert _pauses(broken, run_id) == [{"reason": "kind-changed", "step_id": "hold", "missing": []}]


def test_warn_keeps_failing_a_changed_kind_and_running_a_new_step(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    warned = _deploy(make_app, "v2", v2_new_step, ledger)  # the default: warn
    warned.send(ss.Event("go-on"))
    run = warned.runs.wait(run_id, timeout="10s")
    assert run.status == "completed"
    assert ledger == ["charge", "audit", "ship"]
    assert not _pauses(warned, run_id)


def test_a_paused_run_survives_a_worker_restart_and_is_cancelled(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    broken = _deploy(make_app, "v2", v2_new_step, ledger, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)
    broken.stop()

    # A restarted worker with a short lease: it runs new work and leaves the paused run alone.
    restarted = make_app("shop", app_version="v2", on_nondeterminism="pause")

    @restarted.function(id="other", trigger=ss.on_event("other"))
    def other(ctx: ss.Context) -> str:
        return "ok"

    restarted.start(lease_ttl=0.5)
    [event_id] = restarted.send(ss.Event("other"))
    [other_run] = restarted.runs.list(event_id=event_id)
    assert restarted.runs.wait(other_run.id, timeout="10s").status == "completed"
    assert restarted.runs.get(run_id).status == "paused" and len(_pauses(restarted, run_id)) == 1

    assert restarted.runs.cancel(run_id) == "cancelled"
    assert restarted.runs.get(run_id).status == "cancelled"
    assert ledger == ["charge"]


def test_a_cancel_flagged_while_the_run_is_held_wins_over_its_pause(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    [run_id] = _waiting_runs(make_app, ledger)
    reached, gate = threading.Event(), threading.Event()

    def held(ctx: ss.Context, ledger: Ledger) -> str:
        ctx.step.run("charge", _record(ledger, "charge"))
        reached.set()
        assert gate.wait(10)  # the worker holds the run here while the operator cancels it
        return v2_new_step(ctx, ledger)

    broken = _deploy(make_app, "v2", held, ledger, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    assert reached.wait(10)
    assert broken.runs.cancel(run_id) != "cancelled"  # flagged: the worker holds it
    gate.set()
    assert broken.runs.wait(run_id, timeout="10s").status == "cancelled"
    assert ledger == ["charge"]  # neither the new step nor anything after it ran


def test_a_paused_run_keeps_its_singleton_key_until_it_ends(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    one = {"singleton": ss.Singleton()}
    [run_id] = _waiting_runs(make_app, ledger, fn_options=one)
    broken = _deploy(make_app, "v2", v2_new_step, ledger, one, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    _paused(broken, run_id, 1)
    [skipped] = broken.send(ss.Event("order"))
    assert broken.runs.list(event_id=skipped)[0].status == "skipped"  # paused is live, not ended
    broken.runs.cancel(run_id)
    [started] = broken.send(ss.Event("order"))
    assert broken.runs.list(event_id=started)[0].status != "skipped"


def test_resume_many_resumes_the_paused_runs(make_app: Callable[..., ss.App]) -> None:
    ledger: Ledger = []
    run_ids = _waiting_runs(make_app, ledger, count=2)
    broken = _deploy(make_app, "v2", v2_new_step, ledger, on_nondeterminism="pause")
    broken.send(ss.Event("go-on"))
    for run_id in run_ids:
        _paused(broken, run_id, 1)
    broken.stop()
    fixed = _deploy(make_app, "v3", v3_fixed, ledger)
    assert fixed.runs.resume_many(function_id="order") == 2
    for run_id in run_ids:
        assert fixed.runs.wait(run_id, timeout="10s").status == "completed"
    assert sorted(ledger) == sorted(["charge", "audit", "ship"] * 2)
    assert fixed.runs.resume_many() == 0


def _naps(ctx: ss.Context, ledger: Ledger, name: str, nap: str) -> Callable[[], str]:
    """A branch of unchanged code: a step, a nap, a step; branches nap for different times."""

    def branch() -> str:
        ctx.step.run(f"{name}1", _record(ledger, f"{name}1"))
        ctx.step.sleep(f"{name}-nap", nap)
        return str(ctx.step.run(f"{name}2", _record(ledger, f"{name}2")))

    return branch


@pytest.mark.parametrize("policy", ["pause", "warn"])
def test_parallel_branches_replaying_at_their_own_pace_do_not_diverge(
    make_app: Callable[..., ss.App], policy: str
) -> None:
    # On the first wake, branch a has slept and reaches its next (new) step
    # while branch b's recorded steps are not replayed yet: no divergence.
    ledger: Ledger = []
    app = make_app("shop", on_nondeterminism=policy)

    @app.function(id="gathered", trigger=ss.on_event("gathered"), retries=0)
    async def gathered(ctx: ss.Context) -> str:
        async def branch(name: str, nap: str) -> str:
            await ctx.step.run(f"{name}1", _record(ledger, f"{name}1"))
            await ctx.step.sleep(f"{name}-nap", nap)
            return str(await ctx.step.run(f"{name}2", _record(ledger, f"{name}2")))

        return "".join(await asyncio.gather(branch("a", "50ms"), branch("b", "300ms")))

    @app.function(id="threads", trigger=ss.on_event("threads"), retries=0)
    def threads(ctx: ss.Context) -> str:
        branches = (_naps(ctx, ledger, "c", "50ms"), _naps(ctx, ledger, "d", "300ms"))
        return "".join(ctx.step.parallel(*branches))

    app.start()
    for name, output in (("gathered", "a2b2"), ("threads", "c2d2")):
        [event_id] = app.send(ss.Event(name))
        run = app.runs.wait(app.runs.list(event_id=event_id)[0].id, timeout="20s")
        assert run.status == "completed" and run.output == output
        assert not [s.name for s in app.runs.trace(run.id) if s.kind == "warning"]
    assert sorted(ledger) == ["a1", "a2", "b1", "b2", "c1", "c2", "d1", "d2"]  # each step once


# A branch is a few steps, each followed by a sleep of so many (virtual) seconds, or none.
Layout = list[list[int | None]]
layouts: st.SearchStrategy[Layout] = st.lists(
    st.lists(st.one_of(st.none(), st.integers(1, 6)), min_size=1, max_size=3), min_size=2, max_size=3
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts, use_async=st.booleans(), insert=st.booleans())
def test_unchanged_code_with_parallel_branches_never_pauses(
    layout: Layout, use_async: bool, insert: bool
) -> None:
    # Each wake replays the branches in another interleaving: whichever branch
    # slept least reaches its next new step while others still replay. With
    # ``insert``, a deploy adds a step to the first branch before its recorded
    # ones: that run pauses, and the inserted step never runs.
    ledger: Ledger = []
    deployed = {"insert": False}
    app = ss.App("branches", "sqlite:///:memory:", on_nondeterminism="pause")

    def steps(name: str, naps: list[int | None]) -> list[tuple[Callable[[], str], str | None]]:
        return [
            (_record(ledger, f"{name}.{i}"), None if nap is None else f"{nap}s") for i, nap in enumerate(naps)
        ]

    plan = [(f"b{b}", steps(f"b{b}", naps)) for b, naps in enumerate(layout)]

    if use_async:

        @app.function(id="layout", trigger=ss.on_event("go"), retries=0)
        async def run_async(ctx: ss.Context) -> list[str]:
            async def branch(name: str, calls: list[tuple[Callable[[], str], str | None]]) -> str:
                if deployed["insert"] and name == "b0":
                    await ctx.step.run("inserted", _record(ledger, "inserted"))
                for i, (effect, nap) in enumerate(calls):
                    await ctx.step.run(f"{name}.{i}", effect)
                    if nap is not None:
                        await ctx.step.sleep(f"{name}.{i}-nap", nap)
                return name

            return list(await asyncio.gather(*(branch(name, calls) for name, calls in plan)))

    else:

        @app.function(id="layout", trigger=ss.on_event("go"), retries=0)
        def run_sync(ctx: ss.Context) -> list[str]:
            def branch(name: str, calls: list[tuple[Callable[[], str], str | None]]) -> Callable[[], str]:
                def body() -> str:
                    if deployed["insert"] and name == "b0":
                        ctx.step.run("inserted", _record(ledger, "inserted"))
                    for i, (effect, nap) in enumerate(calls):
                        ctx.step.run(f"{name}.{i}", effect)
                        if nap is not None:
                            ctx.step.sleep(f"{name}.{i}-nap", nap)
                    return name

                return body

            return list(ctx.step.parallel(*(branch(name, calls) for name, calls in plan)))

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        deployed["insert"] = insert and not env.get(run.id).ended
        if deployed["insert"]:
            env.advance("1m")  # past every nap
            assert env.get(run.id).status == "paused" and "inserted" not in ledger
            assert [p["reason"] for p in _pauses(app, run.id)] == ["new-step"]
            return
        done = env.wait(run.id)
        warnings = [s.name for s in env.runs.trace(run.id) if s.kind == "warning"]
    assert done.status == "completed" and done.output == [name for name, _ in plan]
    assert warnings == []
    assert sorted(ledger) == sorted(f"b{b}.{i}" for b, naps in enumerate(layout) for i in range(len(naps)))


def test_an_invalid_policy_fails_at_decoration_naming_the_field() -> None:
    with pytest.raises(ss.ConfigError, match="on_nondeterminism"):
        ss.App("bad", "sqlite:///:memory:", on_nondeterminism="stop")  # type: ignore[arg-type]
    app = ss.App("ok", "sqlite:///:memory:")
    with pytest.raises(ss.ConfigError, match="on_nondeterminism"):
        app.function(id="f", on_nondeterminism="halt")(lambda ctx: None)  # type: ignore[arg-type]


def _is_waiting(app: ss.App, run_id: str) -> Callable[[], bool]:
    return lambda: app.runs.get(run_id).status == "waiting"
