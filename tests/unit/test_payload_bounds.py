"""The bounds on what a run's failure stores, as properties: any error text is
cut to its bound (and only then), and any system event a run's end records
fits within the event size limit, whatever the sizes of what it embeds."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepstone as ss
from stepstone import limits, serde
from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.registry import FINISHED_EVENT
from stepstone.runtime.lifecycle import system_events
from stepstone.store.base import Tx
from stepstone.store.rows import RunRow, RunStatus
from stepstone.truncate import clip

# Characters of 1 to 4 UTF-8 bytes, and JSON-escaped ones.
CHARS = st.sampled_from(["a", "\n", "é", "€", "😀", '"'])


def utf8(text: str) -> int:
    return len(text.encode())


@settings(max_examples=200, deadline=None)
@given(st.lists(CHARS, max_size=400).map("".join), st.integers(min_value=60, max_value=600))
def test_clip_keeps_text_that_fits_and_cuts_the_rest_to_the_bound(text: str, limit: int) -> None:
    out = clip(text, limit)
    if utf8(text) <= limit:
        assert out == text
        return
    assert utf8(out) <= limit
    kept, marker = out.rsplit("\n... [truncated: ", 1)
    assert text.startswith(kept) and marker == f"{utf8(text)} bytes in all]"
    assert utf8(text[: len(kept) + 1]) > limit - utf8(marker) - len("\n... [truncated: ")  # longest prefix
    assert clip(out, limit) == out  # cutting again changes nothing


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([0, 1, limits.MAX_ERROR_TEXT_BYTES, limits.MAX_ERROR_TEXT_BYTES + 1, 3 * 2**20]),
    st.sampled_from([None, 1, limits.MAX_ERROR_TEXT_BYTES + 1, 3 * 2**20]),
    CHARS,
)
def test_every_error_info_is_bounded_and_survives_storage(message: int, tb: int | None, char: str) -> None:
    info = ErrorInfo(
        "T" * (2 * limits.MAX_ERROR_TYPE_BYTES), char * message, None if tb is None else char * tb
    )
    assert utf8(info.type) <= limits.MAX_ERROR_TYPE_BYTES
    assert utf8(info.message) <= limits.MAX_ERROR_TEXT_BYTES
    assert info.traceback is None or utf8(info.traceback) <= limits.MAX_ERROR_TEXT_BYTES
    assert (info.message == char * message) == (utf8(char * message) <= limits.MAX_ERROR_TEXT_BYTES)
    stored = serde.dumps(info.to_json(), what="error")
    assert ErrorInfo.from_json(serde.loads(stored)) == info  # reading it back cuts nothing more


def _listening_registry() -> Any:
    app = ss.App("bounds", database_url="sqlite:///never-opened.db")  # only its registry is used
    app.function(id="watch", trigger=ss.on_event(FINISHED_EVENT))(lambda ctx: None)
    return app.registry


REGISTRY = _listening_registry()
SIZES = [0, 1000, limits.MAX_EVENT_BYTES - 200, limits.MAX_EVENT_BYTES]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    status=st.sampled_from([RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]),
    event_bytes=st.sampled_from(SIZES),
    event_id_chars=st.sampled_from([26, limits.MAX_EVENT_BYTES]),
    output_bytes=st.sampled_from([0, 1000, limits.MAX_EVENT_BYTES, limits.MAX_STEP_OUTPUT_BYTES]),
    message_bytes=st.sampled_from([0, limits.MAX_ERROR_TEXT_BYTES, 2**20]),
)
def test_system_events_fit_within_the_event_limit(
    status: RunStatus, event_bytes: int, event_id_chars: int, output_bytes: int, message_bytes: int
) -> None:
    first = Event("go", {"blob": "b" * max(0, event_bytes - 11)}, "i" * event_id_chars, 1)
    output = (
        serde.dumps("o" * max(0, output_bytes - 2), what="output") if status == RunStatus.COMPLETED else None
    )
    error = None if status == RunStatus.COMPLETED else ErrorInfo("ValueError", "m" * message_bytes)
    run = RunRow(
        id="r1",
        function_id="f",
        status=status,
        event_ids=["e"],
        output=output,
        error=None,
        created_at=1.0,
        started_at=1.0,
        ended_at=2.0,
        attempt=0,
        app_version=None,
        parent_run_id=None,
        parent_step_id=None,
    )
    found = system_events(cast(Tx, None), REGISTRY, run, status, output, error, [first])
    assert found  # completed: finished; failed: failed and finished; cancelled: cancelled
    for event in found:
        data = event.data
        assert utf8(serde.dumps(data, what="event")) <= limits.MAX_EVENT_BYTES
        cut = data.get("truncated", [])
        whole = serde.dumps(first.to_json(), what="event")
        if "event" in cut:
            assert data["event"] is None
        elif "event.data" in cut:
            assert data["event"] == {"name": "go", "id": first.id, "ts": 1}
        else:
            assert json.loads(serde.dumps(data["event"], what="event")) == json.loads(whole)
        if "result" in cut:
            assert data["result"] is None
        elif event.name == FINISHED_EVENT and status == RunStatus.COMPLETED:
            assert serde.dumps(data["result"], what="result") == output
        if error is not None:
            assert data["error"] == {"type": "ValueError", "message": error.message}  # never cut
        if not cut:  # nothing is cut from data that fits
            assert "truncated" not in data
