"""The engine's Python cost per run on SQLite and its start-up (issue 18,
session 7), pinned by what it does, never by how long it takes.

- ``import stepstone`` does not import the ``cel`` package (which imports its
  command line, prompt_toolkit: ~0.1-0.2 s of a cold start) until an
  expression is compiled;
- a run's events are decoded once per invocation: its end reads them again
  only to publish a ``stepstone/function.*`` event;
- nor ``prometheus_client`` (with ``http.server`` and ``urllib``) until a
  worker starts; a run then asks prometheus_client for no labelled
  child it asked for before;
- an invocation of an app without middleware looks up no hooks;
- a step's scalar result is not decoded again from its own encoding;
- ``stepstone worker`` freezes start-up's objects out of the collector's
  full scans and collects young objects every 7,000 allocations, and a
  finished run leaves no objects in reference cycles (session 8).
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import pstats
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import stepstone as ss
from stepstone import executor, metrics, middleware, serde

_LOADED = (
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'cel', 'prompt_toolkit', 'prometheus_client'}))\n"
)


def _python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip()


def test_importing_stepstone_loads_no_cel_until_an_expression_is_compiled() -> None:
    """A process whose functions use no expression never loads ``cel``; the first
    expression compiled loads it, and it evaluates as before."""
    code = (
        "import sys, tempfile, stepstone as ss\n"
        "app = ss.App('t', database_url=f'sqlite:///{tempfile.mkdtemp()}/t.db')\n"
        "app.function(id='plain', trigger=ss.on_event('e'))(lambda ctx: None)\n"
        "app.send(ss.Event('e'))\n" + _LOADED + "from stepstone.expressions import compile_expression\n"
        "expr = compile_expression('event.data.n + 1', field='key')\n"
        "assert expr.key({'event': {'data': {'n': 41}}}) == 42\n" + _LOADED
    )
    assert _python(code).splitlines() == ["[]", "['cel', 'prompt_toolkit']"]


def test_prometheus_client_loads_when_a_worker_starts() -> None:
    """Loaded by the start, not by the first run (a drain's first run would pay it)."""
    code = (
        "import sys, tempfile, stepstone as ss\n"
        "app = ss.App('t', database_url=f'sqlite:///{tempfile.mkdtemp()}/t.db')\n"
        "app.function(id='plain', trigger=ss.on_event('e'))(lambda ctx: 1)\n"
        "[eid] = app.send(ss.Event('e'))\n"
        + _LOADED
        + "app.start(concurrency=1)\n"
        + _LOADED
        + "[run] = app.runs.list(event_id=eid)\n"
        "assert app.runs.wait(run.id, timeout='30s').status == 'completed'\n"
        "app.stop()\n" + _LOADED + "from stepstone import metrics\n"
        'print(b\'stepstone_runs_finished_total{function="plain",status="completed"} 1.0\' in '
        "metrics.render(metrics.StoreSnapshot(0.0, [], [])))\n"
    )
    assert _python(code).splitlines() == ["[]", "['prometheus_client']", "['prometheus_client']", "True"]


def test_a_function_with_an_expression_loads_cel_when_it_is_defined() -> None:
    """An invalid expression is still refused when its function is defined."""
    code = (
        "import sys, stepstone as ss\n"
        "app = ss.App('t', database_url='sqlite:///:memory:')\n" + _LOADED + "try:\n"
        "    app.function(id='f', trigger=ss.on_event('e'), concurrency=ss.Concurrency(limit=1, key='event.'))(\n"
        "        lambda ctx: None)\n"
        "except ss.ConfigError as exc:\n"
        "    print('refused', exc.field)\n" + _LOADED
    )
    lines = _python(code).splitlines()
    assert lines[0] == "[]" and lines[1].startswith("refused") and lines[2] == "['cel', 'prompt_toolkit']"


def _drain(app: ss.App, runs: int, ends: int | None = None) -> None:
    """Queue ``runs`` three-step runs, then drain them with an in-process worker
    until ``ends`` runs (default: ``runs``) have ended."""

    async def step() -> int:
        return 1

    async def three(ctx: ss.Context) -> list[int]:
        return [await ctx.step.run(name, step) for name in ("a", "b", "c")]

    app.function(id="three", trigger=ss.on_event("three"))(three)

    async def main() -> None:
        await app.send_async([ss.Event("three", {"n": i}) for i in range(runs)])
        ended = asyncio.Event()
        count = 0

        def on_end(run_id: str, _read: object = None) -> None:
            nonlocal count
            count += 1
            if count == (ends or runs):
                ended.set()

        app._run_changed = on_end  # type: ignore[method-assign]
        await app.start_async(concurrency=10)
        try:
            await asyncio.wait_for(ended.wait(), 60)
        finally:
            await app.stop_async()

    asyncio.run(main())


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every event a worker's executor decodes, in order."""
    seen: list[Any] = []
    decode = executor._event

    def counting(row: Any) -> Any:
        seen.append(row.id)
        return decode(row)

    monkeypatch.setattr(executor, "_event", counting)
    return seen


def test_a_completed_run_decodes_its_event_once(tmp_path: Path, decoded: list[Any]) -> None:
    """Before: twice, the second time for the run's end, which used it only in
    a ``function.*`` event that a completed run with no listener never sends."""
    app = ss.App("cost", database_url=f"sqlite:///{tmp_path}/cost.db?synchronous=normal")
    try:
        _drain(app, 20)
        runs = app.runs.list(function_id="three", limit=100)
    finally:
        app.close()
    assert len(runs) == 20 and {r.status for r in runs} == {"completed"}
    assert len(decoded) == 20 and len(set(decoded)) == 20, decoded


def test_a_run_end_that_publishes_still_carries_its_event(tmp_path: Path, decoded: list[Any]) -> None:
    """A listener of ``function.finished`` gets the triggering event in the
    payload, decoded (a second time) only for it."""
    app = ss.App("cost", database_url=f"sqlite:///{tmp_path}/cost.db?synchronous=normal")
    heard: list[Any] = []
    app.function(id="listener", trigger=ss.on_event("stepstone/function.finished"))(
        lambda ctx: heard.append(ctx.event.data)
    )
    try:
        _drain(app, 3, ends=6)  # the three runs and their listeners' three
    finally:
        app.close()
    assert sorted(data["event"]["data"]["n"] for data in heard) == [0, 1, 2], heard
    # Six runs (three and their listeners), each decoding its event for its
    # handler and again for its end: with a listener, every end publishes.
    assert len(decoded) == 6 * 2, decoded


def _step_count() -> float:
    text = metrics.render(metrics.StoreSnapshot(0.0, [], [])).decode()
    line = 'stepstone_step_duration_seconds_count{function="three"} '
    return sum(float(x[len(line) :]) for x in text.splitlines() if x.startswith(line))


def test_a_run_records_its_metrics_without_asking_for_their_labelled_children_again(
    tmp_path: Path,
) -> None:
    """prometheus_client's ``labels()`` converts, checks and locks at each call:
    six per run before (two at its start, one per step, one at its end)."""
    app = ss.App("cost", database_url=f"sqlite:///{tmp_path}/cost.db?synchronous=normal")
    before = _step_count()
    profile = cProfile.Profile()
    try:
        profile.enable()
        _drain(app, 20)
        profile.disable()
    finally:
        app.close()
    assert _step_count() - before == 60  # every step still observed
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    asked = sum(
        v[1] for (file, _, name), v in stats.items() if "prometheus_client" in file and name == "labels"
    )
    assert asked <= 4, asked  # the first run's: runs started, queue delay, step duration, runs finished


def test_an_invocation_without_middleware_looks_up_no_hooks() -> None:
    """Every run built a table of nine hooks from an empty list of middleware."""
    assert middleware.Hooks(())._by_hook is middleware.Hooks([])._by_hook
    assert not middleware.Hooks(()).active and not middleware.Hooks(()).has("on_failure")

    class Tracer(ss.Middleware):
        def before_step(self, ctx: ss.Context, step_id: str) -> None:
            return None

    hooks = middleware.Hooks([Tracer()])
    assert hooks.active and hooks.has("before_step") and not hooks.has("after_step")
    assert not middleware.Hooks(())._by_hook["before_step"]  # the shared table stays empty


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(_json)
def test_a_values_round_trip_equals_decoding_its_encoding(value: Any) -> None:
    """What a step returns to its handler on its first execution is what a
    replay decodes from the memo (``serde``'s promise): the same value, of the
    same type, for scalars without a decode."""
    text = serde.dumps(value, what="value")
    decoded = serde.loads(text)
    assert serde.round_trip(value, text) == decoded
    assert type(serde.round_trip(value, text)) is type(decoded)


def test_a_step_returning_a_scalar_decodes_nothing(tmp_path: Path) -> None:
    """Three steps returning ints: their results are not decoded from their own
    encoding (``serde.round_trip``; the memo is still what a replay decodes)."""
    app = ss.App("cost", database_url=f"sqlite:///{tmp_path}/cost.db?synchronous=normal")
    decodes = 0
    real = serde._decode

    def counting(text: str) -> Any:
        nonlocal decodes
        decodes += 1
        return real(text)

    try:
        serde._decode = counting  # type: ignore[assignment]
        _drain(app, 10)
    finally:
        serde._decode = real
        app.close()
    assert decodes == 10, decodes  # per run, its event's data; before, 40: each step's result too


def test_the_worker_command_freezes_start_up_and_collects_young_objects_less_often() -> None:
    """``stepstone worker`` owns its process: once started, start-up's objects
    leave the collector's full scans and the youngest generation is collected
    every ``YOUNG_COLLECTED`` allocations instead of 700 (in a subprocess: the
    collector's settings are the process's)."""
    code = (
        "import gc\n"
        "from stepstone.cli import worker\n"
        "before = gc.get_threshold()\n"
        "worker._settle_heap()\n"
        "print(before[0], gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:], gc.get_freeze_count() > 1000)\n"
    )
    assert _python(code).split() == ["700", "7000", "True", "True"]


def test_a_finished_run_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    """A run's objects (its interpreter, context, logger, journal, rows) are
    freed when it ends, not left in reference cycles for the collector: the
    context and the interpreter held each other, and so did the context and
    its logger (49 objects a run, each collection scanning them)."""
    app = ss.App("cost", database_url=f"sqlite:///{tmp_path}/cost.db?synchronous=normal")
    runs = 40

    async def step() -> int:
        return 1

    async def three(ctx: ss.Context) -> int:
        ctx.logger.debug("three")  # the logger is made and used
        return sum([await ctx.step.run(name, step) for name in ("a", "b", "c")])

    app.function(id="three", trigger=ss.on_event("three"))(three)

    async def main() -> int:
        ended = 0
        warm, done = asyncio.Event(), asyncio.Event()

        def on_end(run_id: str, _read: object = None) -> None:
            nonlocal ended
            ended += 1
            if ended == 10:
                warm.set()
            if ended == 10 + runs:
                done.set()

        app._run_changed = on_end  # type: ignore[method-assign]
        await app.send_async([ss.Event("three") for _ in range(10)])
        await app.start_async(concurrency=10)
        try:
            await asyncio.wait_for(warm.wait(), 60)
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects kept in gc.garbage
            await app.send_async([ss.Event("three") for _ in range(runs)])
            await asyncio.wait_for(done.wait(), 60)
            gc.collect()
            return len(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            await app.stop_async()

    try:
        garbage = asyncio.run(main())
    finally:
        app.close()
    assert garbage < runs, f"{garbage} objects in cycles after {runs} runs"
