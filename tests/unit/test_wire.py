"""The push protocol's records round-trip through JSON unchanged."""

from __future__ import annotations

import json

import pytest

from stepstone.errors import ErrorInfo
from stepstone.events import Event
from stepstone.store.rows import (
    EventRow,
    LeasedRun,
    RunRow,
    RunStatus,
    SpanRow,
    StepKind,
    StepRow,
    StepStatus,
    WaitKind,
    WaitRow,
)
from stepstone.wire import (
    Answer,
    BeginWait,
    Decision,
    EffectRecord,
    ExpireWait,
    ReceiveSignal,
    SendEvents,
    StartChild,
    WireError,
    decode_request,
    effect_from_json,
    effect_to_json,
    encode_request,
)

WAIT = WaitRow(
    run_id="r",
    step_id="w",
    kind=WaitKind.EVENT,
    event_name="paid",
    match_key="id",
    match_value="7",
    expression="async.data.id == '7'",
    created_at=1.5,
    expires_at=9.0,
)
EFFECTS: list[EffectRecord] = [
    BeginWait(waits=(WAIT,), since=None, now=1.5),
    StartChild(
        run_id="r",
        step_id="call",
        function_id="child",
        data={"x": [1, {"y": None}]},
        now=2.0,
        expires_at=None,
        child_id="c1",
    ),
    SendEvents(events=(Event("sent", {"a": 1}, "e1", 1000),), now=3.0),
    ExpireWait(run_id="r", step_id="w", failure='{"type":"InvokeTimeout"}', now=4.0),
    ReceiveSignal(
        wait=WaitRow(
            run_id="r", step_id="s", kind=WaitKind.SIGNAL, event_name="", match_value="go", created_at=5.0
        )
    ),
]


@pytest.mark.parametrize("record", EFFECTS, ids=lambda r: r.kind)
def test_each_effect_kind_round_trips(record: EffectRecord) -> None:
    assert effect_from_json(effect_to_json(record)) == record


def test_requests_and_answers_round_trip() -> None:
    run = RunRow(
        id="r",
        function_id="f",
        status=RunStatus.RUNNING,
        event_ids=["e"],
        output=None,
        error=None,
        created_at=1.0,
        started_at=1.0,
        ended_at=None,
        attempt=2,
        app_version="v1",
        parent_run_id=None,
        parent_step_id=None,
    )
    step = StepRow(
        run_id="r",
        step_id="a",
        position=0,
        kind=StepKind.RUN,
        status=StepStatus.COMPLETED,
        attempts=1,
        output='"x"',
        started_at=1.0,
        ended_at=1.1,
        fingerprint="m.f",
    )
    leased = LeasedRun(
        run=run,
        epoch=3,
        events=[EventRow(seq=1, id="e", name="go", data="{}", ts=1000, received_at=1.0)],
        steps=[step],
    )
    assert decode_request(encode_request(leased, "req-1")) == (leased, "req-1")
    without_id = json.loads(encode_request(leased, "req-1"))
    del without_id["request_id"]
    with pytest.raises(WireError, match="request_id"):  # an answer could not be bound to it
        decode_request(json.dumps(without_id).encode())
    span = SpanRow(run_id="r", kind="step", name="a", started_at=1.0, ended_at=1.1, status="completed")
    for decision in (
        Decision(status=RunStatus.COMPLETED, output='{"ok":true}'),
        Decision(status=RunStatus.FAILED, error=ErrorInfo("Boom", "it broke", "tb")),
        Decision(status=RunStatus.SLEEPING, wake_at=10.0, attempt=2),
    ):
        answer = Answer(
            request_id="req-1",
            steps=(step,),
            spans=(span,),
            effects=tuple(EFFECTS),
            decision=decision,
            deferred=EFFECTS[4],
        )
        assert Answer.decode(answer.encode()) == answer
        assert answer.run_ids() == {"r"}


def test_bad_documents_are_refused() -> None:
    with pytest.raises(WireError):
        Answer.decode(b"not json")
    with pytest.raises(WireError):
        decode_request(b'{"protocol": 99}')
    with pytest.raises(WireError, match="request_id"):
        Answer.decode(
            b'{"protocol": 1, "request_id": "", "steps": [], "spans": [], "effects": [], "decision": {}}'
        )
    with pytest.raises(WireError):
        effect_from_json({"kind": "teleport"})
    with pytest.raises(WireError):
        Decision.from_json({"status": "exploded"})
