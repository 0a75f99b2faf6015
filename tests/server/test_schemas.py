"""The wire format: literals in step with the engine, round trips without loss."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

import pytest

import stepstone as ss
from stepstone.server.params import decode_cursor, encode_cursor, parse_moment
from stepstone.server.schemas import JobStatus, RunOut, RunStatus, SpanOut
from stepstone.store.rows import RUN_STATUSES
from stepstone.store.viewrows import JOB_STATUSES


def test_status_literals_match_the_engine() -> None:
    assert set(get_args(RunStatus)) == set(RUN_STATUSES)
    assert set(get_args(JobStatus)) == set(JOB_STATUSES)


def test_runs_and_spans_round_trip_through_json() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    run = ss.Run(
        id="r",
        function_id="f",
        status="failed",
        output={"a": [1, None]},
        error=ss.ErrorInfo("ValueError", "bad", "Traceback ..."),
        event_ids=["e"],
        created_at=moment,
        started_at=moment,
        ended_at=None,
        steps=[ss.StepRecord("s", "completed", 2, [1], None, "run", moment, moment)],
        attempt=1,
        meta={"rerun_of": "q"},
    )
    assert RunOut.model_validate_json(RunOut.of(run).model_dump_json()).to_run() == run
    span = ss.Span("step", "s", "failed", 1, moment, None, ss.ErrorInfo("E", "m"), {"wake_at": 1.5})
    assert SpanOut.model_validate_json(SpanOut.of(span).model_dump_json()).to_span() == span


def test_moments_and_cursors() -> None:
    assert parse_moment("2026-01-01T00:00:00Z", "since") == pytest.approx(1767225600.0)
    assert parse_moment("2026-01-01T01:00:00+01:00", "since") == pytest.approx(1767225600.0)
    assert parse_moment("2026-01-01T00:00:00", "since") == pytest.approx(1767225600.0)  # naive is UTC
    assert parse_moment("1767225600.5", "until") == pytest.approx(1767225600.5)
    assert parse_moment(None, "since") is None
    for bad in ("tomorrow", "inf", "2026-13-01"):
        with pytest.raises(ss.ConfigError) as raised:
            parse_moment(bad, "since")
        assert raised.value.field == "since"
    assert decode_cursor(encode_cursor("01ABC")) == "01ABC"
    for bad in ("", "!!!", "eyJ4IjoxfQ", "bnVsbA"):
        with pytest.raises(ss.ConfigError, match="malformed cursor"):
            decode_cursor(bad)
