"""Traces, OpenTelemetry export, the replay-safe logger, middleware, encryption."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.testing import TestEnv

from ..conftest import FAST, send_and_wait, table_rows
from ..polling import wait_for


def test_trace_of_a_run_with_retries_a_sleep_and_a_wait() -> None:
    app = ss.App("trace", database_url="sqlite:///unused.db")
    attempts: Counter[str] = Counter()

    def flaky() -> str:
        attempts["x"] += 1
        if attempts["x"] < 3:
            raise ConnectionError(f"attempt {attempts['x']}")
        return "ok"

    @app.function(id="traced", trigger=ss.on_event("go"), backoff=FAST)
    def traced(ctx: ss.Context) -> str:
        ctx.step.run("flaky", flaky)
        ctx.step.sleep("nap", "1h")
        got = ctx.step.wait_for_event("approval", event="approved", timeout="1d")
        return "approved" if got else "timed out"

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        env.advance("2h")
        env.send(ss.Event("approved"))
        done = env.get(run.id)
        trace = app.runs.trace(run.id)
    assert done.output == "approved"
    assert [(s.kind, s.name, s.status, s.attempt) for s in trace] == [
        ("run", "traced", "completed", 0),
        ("queued", "queue", "done", 0),
        ("step", "flaky", "retrying", 1),
        ("step", "flaky", "retrying", 2),
        ("step", "flaky", "completed", 3),
        ("sleep", "nap", "completed", 0),
        ("wait", "approval", "completed", 0),
    ]
    retries = [s for s in trace if s.status == "retrying"]
    assert [s.error.message for s in retries if s.error] == ["attempt 1", "attempt 2"]
    assert all(s.error and "ConnectionError" in (s.error.traceback or "") for s in retries)
    nap = next(s for s in trace if s.kind == "sleep")
    assert nap.duration is not None and 3599 <= nap.duration <= 3601
    assert trace[0].duration is not None and trace[0].duration >= 3600


def test_opentelemetry_spans_are_parented_under_the_send(app: ss.App) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.middleware = (ss.OpenTelemetryMiddleware(tracer_provider=provider),)
    calls: Counter[str] = Counter()

    def flaky() -> str:
        calls["f"] += 1
        if calls["f"] == 1:
            raise RuntimeError("first")
        return "ok"

    @app.function(id="otel", trigger=ss.on_event("go"), backoff=FAST)
    async def otel(ctx: ss.Context) -> None:
        await ctx.step.run("one", lambda: 1)
        await ctx.step.run("flaky", flaky)

    app.start()
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("http request") as request:
        run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed"
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    runs = by_name["stepstone.run otel"]
    assert len(runs) == 2  # two invocations: before and after the retry
    trace_id = request.get_span_context().trace_id
    assert all(
        s.context.trace_id == trace_id and s.parent.span_id == request.get_span_context().span_id
        for s in runs
    )
    steps = by_name["stepstone.step one"] + by_name["stepstone.step flaky"]
    assert sorted((s.attributes["stepstone.step_id"], s.attributes["stepstone.attempt"]) for s in steps) == [
        ("flaky", 0),
        ("flaky", 1),
        ("one", 0),
    ]
    run_span_ids = {s.context.span_id for s in runs}
    assert all(s.parent.span_id in run_span_ids for s in steps)
    assert all(s.attributes["stepstone.run_id"] == run.id for s in steps + runs)
    failed = [s for s in by_name["stepstone.step flaky"] if s.attributes["stepstone.attempt"] == 0]
    assert failed[0].status.status_code == trace.StatusCode.ERROR


def test_logger_prints_each_line_once_across_replays(caplog: pytest.LogCaptureFixture) -> None:
    app = ss.App("log", database_url="sqlite:///unused.db")
    deployed = {"v2": False}

    def final(ctx: ss.Context) -> int:
        ctx.logger.info("inside final")
        return 2

    @app.function(id="logs", trigger=ss.on_event("go"))
    def logs(ctx: ss.Context) -> None:
        ctx.logger.info("start")
        if not deployed["v2"]:
            ctx.step.run("old-step", lambda: 1)  # removed by the "deploy" below
        ctx.logger.info("before nap")
        ctx.step.sleep("nap", "1h")
        ctx.logger.info("after nap")
        ctx.step.run("final", final, ctx)
        ctx.logger.info("done")

    caplog.set_level(logging.INFO, logger="stepstone.run")
    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        deployed["v2"] = True  # the step is removed while the run sleeps
        env.wait(run.id)
        warnings = [s for s in app.runs.trace(run.id) if s.kind == "warning"]
    lines = [r.getMessage() for r in caplog.records if r.name == "stepstone.run"]
    assert lines == ["start", "before nap", "after nap", "inside final", "done"]
    record = next(r for r in caplog.records if r.getMessage() == "inside final")
    assert attrgetter("run_id", "function_id", "step_id", "attempt")(record) == (run.id, "logs", "final", 0)
    [warning] = warnings  # the trace names both the new step and the one never reached
    assert warning.name == "nondeterminism" and "'final'" in warning.detail and "'old-step'" in warning.detail


class Recorder(ss.Middleware):
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def transform_input(self, ctx: ss.Context, steps: dict[str, Any]) -> dict[str, Any]:
        self.log.append(f"{self.name}:input:{sorted(steps)}")
        return {k: v["wrapped"] if isinstance(v, dict) and "wrapped" in v else v for k, v in steps.items()}

    async def before_execution(self, ctx: ss.Context) -> None:
        self.log.append(f"{self.name}:before_execution")

    def after_execution(self, ctx: ss.Context) -> None:
        self.log.append(f"{self.name}:after_execution")

    def before_step(self, ctx: ss.Context, step_id: str) -> None:
        self.log.append(f"{self.name}:before_step:{step_id}")

    async def after_step(
        self, ctx: ss.Context, step_id: str, output: Any, error: BaseException | None
    ) -> None:
        self.log.append(
            f"{self.name}:after_step:{step_id}:{output if error is None else type(error).__name__}"
        )

    def transform_output(self, ctx: ss.Context, output: Any, step_id: str | None) -> Any:
        self.log.append(f"{self.name}:output:{step_id}")
        return {"wrapped": output}

    def before_send_events(self, ctx: ss.Context | None, events: list[ss.Event]) -> list[ss.Event]:
        self.log.append(f"{self.name}:send:{[e.name for e in events]}")
        return [ss.Event(e.name, {**e.data, "tagged": True}, e.id, e.ts) for e in events]

    def after_send_events(self, ctx: ss.Context | None, ids: list[str]) -> None:
        self.log.append(f"{self.name}:sent:{len(ids)}")

    def on_failure(self, ctx: ss.Context, error: ss.ErrorInfo) -> None:
        self.log.append(f"{self.name}:failure:{error.message}")


def test_middleware_hook_order_and_once_only() -> None:
    log: list[str] = []
    app = ss.App("mw", database_url="sqlite:///unused.db", middleware=[Recorder(log, "app")])
    seen: list[Any] = []

    @app.function(id="mw", trigger=ss.on_event("go"), middleware=[Recorder(log, "fn")])
    def mw(ctx: ss.Context) -> str:
        seen.append(ctx.step.run("a", lambda: 1))
        ctx.step.send_event("notify", ss.Event("note"))
        ctx.step.sleep("nap", "1m")
        ctx.step.run("b", lambda: 2)
        return "out"

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        first = list(log)
        log.clear()
        done = env.wait(run.id)
        notes = app.store.read_sync(lambda tx: tx.list_events("note", None, None, 10))
    assert seen == [1, 1]  # the handler saw plain values, first run and replay
    assert done.output == {"wrapped": {"wrapped": "out"}}  # stored as transformed (fn, then app)
    assert done.steps[0].output == {"wrapped": {"wrapped": 1}}
    assert first == [
        "app:send:['go']",
        "app:sent:1",
        "app:input:[]",
        "fn:input:[]",
        "app:before_execution",
        "fn:before_execution",
        "app:before_step:a",
        "fn:before_step:a",
        "app:after_step:a:1",
        "fn:after_step:a:1",
        "app:output:a",
        "fn:output:a",
        "app:send:['note']",
        "fn:send:['note']",
        "app:sent:1",
        "fn:sent:1",
        "app:after_execution",
        "fn:after_execution",
    ]
    assert log == [  # the resumed invocation: no hook repeats an earlier step's actions
        "app:input:['a', 'notify']",
        "fn:input:['a', 'notify']",
        "app:before_execution",
        "fn:before_execution",
        "app:before_step:b",
        "fn:before_step:b",
        "app:after_step:b:2",
        "fn:after_step:b:2",
        "app:output:b",
        "fn:output:b",
        "app:after_execution",
        "fn:after_execution",
        "app:output:None",
        "fn:output:None",
    ]
    [note] = notes  # sent once, across the replay; stored as before_send_events made it
    assert json.loads(note.data) == {"tagged": True}


def test_middleware_on_failure_runs_once() -> None:
    log: list[str] = []
    app = ss.App("mw", database_url="sqlite:///unused.db", middleware=[Recorder(log, "app")])

    @app.function(id="bad", trigger=ss.on_event("go"), retries=2, backoff=FAST)
    def bad(ctx: ss.Context) -> None:
        ctx.step.run("boom", lambda: 1 / 0)

    with TestEnv(app) as env:
        [run] = env.send(ss.Event("go"))
        assert env.wait(run.id).status == "failed"
    assert [line for line in log if ":failure:" in line] == ["app:failure:division by zero"]
    assert [line for line in log if line.startswith("app:before_step")] == ["app:before_step:boom"] * 3


SECRET = "4111-1111-1111-1111"


def _raw_values(db_url: str) -> str:
    rows = [str(r) for table in ("steps", "runs", "events", "spans") for r in table_rows(db_url, table)]
    return "\n".join(rows)


def test_encryption_keeps_plaintext_out_of_the_store(make_app: Callable[..., ss.App], db_url: str) -> None:
    key = "a long random secret for tests"
    app = make_app(middleware=[ss.EncryptionMiddleware(key)])
    seen: list[Any] = []

    @app.function(id="pay", trigger=ss.on_event("card"), backoff=FAST)
    def pay(ctx: ss.Context) -> dict[str, Any]:
        card = ctx.step.run("read-card", lambda: ctx.event.data["encrypted"]["number"])
        seen.append(card)
        ctx.step.send_event(
            "forward", ss.Event("card.seen", {"user": ctx.event.data["user"], "encrypted": {"number": card}})
        )
        # Forces a replay that must decrypt the memo. Not 10ms: a sleep whose
        # time has come by the time it reaches the loop completes inline, with
        # no replay (it did, on a loaded host, and ``seen`` had one card).
        ctx.step.sleep("nap", "500ms")
        return {"last4": card[-4:], "card": card}

    @app.function(id="seen", trigger=ss.on_event("card.seen", if_="event.data.user == 'u1'"))
    def seen_fn(ctx: ss.Context) -> str:
        return str(ctx.event.data["encrypted"]["number"])

    app.start()
    run = send_and_wait(app, ss.Event("card", {"user": "u1", "encrypted": {"number": SECRET}}))
    assert run.status == "completed", run.error
    assert seen == [SECRET, SECRET]
    assert ss.is_encrypted(run.output) and ss.is_encrypted(run.steps[0].output)
    [forwarded] = app.runs.list(function_id="seen")  # the CEL condition on a clear field still worked
    assert app.runs.wait(forwarded.id).status == "completed"
    raw = _raw_values(db_url)
    assert SECRET not in raw and "1111" not in raw


def test_rotation_wrong_key_and_decrypt_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/rot.db"

    def make(mw: ss.EncryptionMiddleware) -> ss.App:
        app = ss.App("rot", database_url=url, middleware=[mw])

        @app.function(id="r", trigger=ss.on_event("go"))
        async def r(ctx: ss.Context) -> str:
            value = await ctx.step.run("secret", lambda: "s3cr3t")
            await ctx.step.wait_for_event("resume", event="resume", timeout="1h")
            return str(value)

        return app

    old = make(ss.EncryptionMiddleware("old key"))
    [eid] = old.send(ss.Event("go"))
    old.start()
    run_id = old.runs.list(event_id=eid)[0].id
    wait_for(lambda: old.runs.get(run_id).status == "waiting", 10, "the run to wait")
    old.stop()  # the step is stored under the old key; the run waits for "resume"

    rotated = make(ss.EncryptionMiddleware("new key", fallback_keys=["old key"]))
    rotated.start()
    rotated.send(ss.Event("resume"))
    done = rotated.runs.wait(run_id)
    rotated.close()
    assert done.status == "completed" and ss.is_encrypted(done.output)

    reader = ss.EncryptionMiddleware("new key", decrypt_only=True)
    assert reader.reveal(done.output, "output") == "s3cr3t"

    wrong = make(ss.EncryptionMiddleware("some other key"))
    [eid2] = old.send(ss.Event("go"))
    old.start()
    second = old.runs.list(event_id=eid2)[0].id
    wait_for(lambda: old.runs.get(second).status == "waiting", 10, "the run to wait")
    old.stop()
    wrong.start()
    wrong.send(ss.Event("resume"))
    failed = wrong.runs.wait(second)
    wrong.close()
    old.close()
    assert failed.status == "failed"
    assert failed.error is not None and failed.error.type == "EncryptionError"
    assert "cannot decrypt" in failed.error.message and "secret" in failed.error.message
