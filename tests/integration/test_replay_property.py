"""Property: for random step programs with random failures, no completed step is
ever executed again, and the output equals that of a failure-free run."""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss

from ..conftest import FAST, send_and_wait

Item = tuple[Any, ...]

step_item = st.tuples(st.just("step"), st.integers(0, 3))
parallel_item = st.tuples(st.just("parallel"), st.lists(st.integers(0, 2), min_size=2, max_size=3))
handler_error = st.tuples(st.just("handler-error"), st.integers(1, 2))
sleep_item = st.tuples(st.just("sleep"), st.integers(1, 5))


def few_handler_errors(program: list[Item]) -> bool:
    raised: int = sum(i[1] for i in program if i[0] == "handler-error")
    return raised <= 4


programs: st.SearchStrategy[list[Item]] = st.lists(
    st.one_of(step_item, step_item, parallel_item, handler_error, sleep_item), min_size=1, max_size=7
).filter(few_handler_errors)


def expected_output(program: list[Item]) -> list[Any]:
    out: list[Any] = []
    for index, item in enumerate(program):
        if item[0] == "step":
            out.append(f"s{index}:{len(out)}")
        elif item[0] == "parallel":
            out.append([f"p{index}.{j}" for j in range(len(item[1]))])
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs, use_async=st.booleans())
def test_random_programs_replay_exactly(program: list[Item], use_async: bool) -> None:
    executions: Counter[str] = Counter()
    completions: Counter[str] = Counter()
    handler_errors: Counter[int] = Counter()

    def make_step(name: str, failures: int, value: Any) -> Any:
        def fn() -> Any:
            executions[name] += 1
            if executions[name] <= failures:
                raise RuntimeError(f"{name} attempt {executions[name]}")
            completions[name] += 1
            return value

        return fn

    def plan(ctx: ss.Context) -> list[tuple[str, Any]]:
        calls: list[tuple[str, Any]] = []
        out_len = 0
        for index, item in enumerate(program):
            kind = item[0]
            if kind == "step":
                calls.append(("run", (f"s{index}", make_step(f"s{index}", item[1], f"s{index}:{out_len}"))))
                out_len += 1
            elif kind == "parallel":
                calls.append(
                    (
                        "parallel",
                        [
                            (f"p{index}.{j}", make_step(f"p{index}.{j}", f, f"p{index}.{j}"))
                            for j, f in enumerate(item[1])
                        ],
                    )
                )
                out_len += 1
            elif kind == "handler-error":
                calls.append(("raise", (index, item[1])))
            else:
                calls.append(("sleep", (f"z{index}", f"{item[1]}ms")))
        return calls

    def maybe_raise(index: int, times: int) -> None:
        if handler_errors[index] < times:
            handler_errors[index] += 1
            raise ValueError(f"handler error at {index}")

    with tempfile.TemporaryDirectory() as tmp:
        app = ss.App("prop", database_url=f"sqlite:///{tmp}/db.sqlite")

        if use_async:

            @app.function(id="prog", trigger=ss.on_event("go"), retries=5, backoff=FAST)
            async def handler(ctx: ss.Context) -> list[Any]:
                out: list[Any] = []
                for kind, arg in plan(ctx):
                    if kind == "run":
                        out.append(await ctx.step.run(arg[0], arg[1]))
                    elif kind == "parallel":
                        out.append(
                            await ctx.step.parallel(*(lambda n=n, f=f: ctx.step.run(n, f) for n, f in arg))
                        )
                    elif kind == "raise":
                        maybe_raise(*arg)
                    else:
                        await ctx.step.sleep(*arg)
                return out
        else:

            @app.function(id="prog", trigger=ss.on_event("go"), retries=5, backoff=FAST)
            def sync_handler(ctx: ss.Context) -> list[Any]:
                out: list[Any] = []
                for kind, arg in plan(ctx):
                    if kind == "run":
                        out.append(ctx.step.run(arg[0], arg[1]))
                    elif kind == "parallel":
                        out.append(ctx.step.parallel(*(lambda n=n, f=f: ctx.step.run(n, f) for n, f in arg)))
                    elif kind == "raise":
                        maybe_raise(*arg)
                    else:
                        ctx.step.sleep(*arg)
                return out

        app.start(concurrency=2)
        try:
            run = send_and_wait(app, ss.Event("go"), timeout="30s")
        finally:
            app.close()

    assert run.status == "completed", (run.error, program)
    assert run.output == expected_output(program)
    assert all(count == 1 for count in completions.values()), completions
    expected_steps = {f"s{i}" for i, item in enumerate(program) if item[0] == "step"} | {
        f"p{i}.{j}" for i, item in enumerate(program) if item[0] == "parallel" for j in range(len(item[1]))
    }
    assert set(completions) == expected_steps
