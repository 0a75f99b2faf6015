"""A huge error is stored bounded, everywhere it is stored, and every event a
run's end records stays within the event size limit (on both stores)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import stepstone as ss
from stepstone import limits
from stepstone.registry import FAILED_EVENT, FINISHED_EVENT
from tests.conftest import FAST, query, run_of
from tests.polling import wait_for

HUGE = 6 * 1024 * 1024  # a 6 MiB message, and a traceback longer still
MARKER = f"[truncated: {HUGE + len('outer: ')} bytes in all]"


def huge_failure() -> None:
    try:
        raise KeyError("k" * HUGE)  # its text lands in the traceback too
    except KeyError as cause:
        raise ValueError("outer: " + "m" * HUGE) from cause


def within_bounds(error_json: str) -> dict[str, Any]:
    """A stored error's parts: each within its bound, the message with its marker."""
    error: dict[str, Any] = json.loads(error_json)
    assert error["type"] == "ValueError"
    assert len(error["message"].encode()) <= limits.MAX_ERROR_TEXT_BYTES
    assert error["message"].startswith("outer: mmm") and error["message"].endswith(MARKER)
    if "traceback" in error:
        assert len(error["traceback"].encode()) <= limits.MAX_ERROR_TEXT_BYTES
        assert error["traceback"].startswith("Traceback") and "bytes in all]" in error["traceback"]
    return error


def test_a_huge_error_is_stored_bounded_and_events_stay_within_their_limit(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app()
    finished: list[dict[str, Any]] = []

    @app.function(id="boom", trigger=ss.on_event("go"), retries=1, backoff=FAST)
    def boom(ctx: ss.Context) -> None:
        ctx.step.run("fine", lambda: 1)
        ctx.step.run("fails", huge_failure)

    @app.function(id="watch", trigger=ss.on_event(FINISHED_EVENT))
    def watch(ctx: ss.Context) -> None:
        finished.append(ctx.event.data)

    app.start()
    # The triggering event is as large as allowed: embedding it whole in the
    # failure event (next to the error) would exceed the event limit.
    blob = "b" * (limits.MAX_EVENT_BYTES - 100)
    [event_id] = app.send(ss.Event("go", {"blob": blob}))
    run = app.runs.wait(run_of(app, event_id, "boom").id, timeout="60s")

    assert run.status == "failed" and run.error is not None
    assert run.error.type == "ValueError" and run.error.message.endswith(MARKER)
    rows = query(db_url, f"SELECT error FROM runs WHERE id = '{run.id}'")
    within_bounds(rows[0][0])
    steps = query(db_url, f"SELECT status, error FROM steps WHERE run_id = '{run.id}' AND step_id = 'fails'")
    assert [s for s, _ in steps] == ["failed"]
    assert "traceback" in within_bounds(steps[0][1])
    spans = query(db_url, f"SELECT error FROM spans WHERE run_id = '{run.id}' AND error IS NOT NULL")
    assert spans  # the first attempt, retried, kept its own trace entry
    for (span_error,) in spans:
        within_bounds(span_error)

    events = query(db_url, "SELECT name, data FROM events")
    for name, data in events:
        assert len(data.encode()) <= limits.MAX_EVENT_BYTES, name
    failed = [json.loads(data) for name, data in events if name == FAILED_EVENT]
    assert len(failed) == 1
    assert failed[0]["run_id"] == run.id and failed[0]["truncated"] == ["event.data"]
    assert failed[0]["event"] == {"name": "go", "id": event_id, "ts": failed[0]["event"]["ts"]}
    assert within_bounds(json.dumps(failed[0]["error"]))["message"] == run.error.message

    wait_for(lambda: finished, 30, "the function.finished listener to run")
    assert finished[0]["status"] == "failed" and finished[0]["truncated"] == ["event.data"]


def test_a_4mb_output_leaves_the_finished_event_within_its_limit(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app()
    big = "x" * (limits.MAX_STEP_OUTPUT_BYTES - 2)

    @app.function(id="big", trigger=ss.on_event("go"))
    def big_output(ctx: ss.Context) -> str:
        return big

    @app.function(id="watch", trigger=ss.on_event(FINISHED_EVENT))
    def watch(ctx: ss.Context) -> None:
        pass

    app.start()
    [event_id] = app.send(ss.Event("go", {"small": 1}))
    run = app.runs.wait(run_of(app, event_id, "big").id, timeout="60s")
    assert run.status == "completed" and run.output == big
    rows = query(db_url, f"SELECT data FROM events WHERE name = '{FINISHED_EVENT}'")
    assert all(len(data.encode()) <= limits.MAX_EVENT_BYTES for (data,) in rows)
    [finished] = [e for e in (json.loads(data) for (data,) in rows) if e["run_id"] == run.id]
    assert finished["result"] is None and finished["truncated"] == ["result"]
    assert finished["event"]["data"] == {"small": 1}  # what fits is kept whole
