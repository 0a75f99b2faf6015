"""``on_nondeterminism="pause"``, the ``paused`` status and resume (issue 13,
points 4 and 5).

A run is left waiting by one ``App`` (code v1). Another ``App`` on the same
database, holding changed code, wakes it: with ``on_nondeterminism="pause"``
the run stops before the step its history does not hold, and stays out of the
queue until an operator resumes it under the code deployed by then. A ledger of
side effects proves which step functions ran, and how many times.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

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


def test_an_invalid_policy_fails_at_decoration_naming_the_field() -> None:
    with pytest.raises(ss.ConfigError, match="on_nondeterminism"):
        ss.App("bad", "sqlite:///:memory:", on_nondeterminism="stop")  # type: ignore[arg-type]
    app = ss.App("ok", "sqlite:///:memory:")
    with pytest.raises(ss.ConfigError, match="on_nondeterminism"):
        app.function(id="f", on_nondeterminism="halt")(lambda ctx: None)  # type: ignore[arg-type]


def _is_waiting(app: ss.App, run_id: str) -> Callable[[], bool]:
    return lambda: app.runs.get(run_id).status == "waiting"
