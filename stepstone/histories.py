"""A run's history as a JSON document: what ``app.runs.export`` writes and
``app.check(histories=[...])`` replays, so a team can commit the histories of
real runs next to its tests and fail CI when new code no longer fits them.

The document holds what the store holds: step outputs and event data exactly
as stored, so an output sealed by ``EncryptionMiddleware`` stays ciphertext in
the file and is decrypted at check time by the checking app's middleware
(a committed history never carries a secret in clear).
"""

from __future__ import annotations

from typing import Any

from stepstone import serde
from stepstone.errors import ConfigError
from stepstone.store.rows import EventRow, RunHistory, RunRow, RunStatus, StepKind, StepRow, StepStatus

FORMAT = "stepstone.history/1"


def to_json(history: RunHistory) -> dict[str, Any]:
    """The JSON-serialisable document of ``history``."""
    run = history.run
    return {
        "format": FORMAT,
        "run_id": run.id,
        "function_id": run.function_id,
        "status": str(run.status),
        "app_version": run.app_version,
        "attempt": run.attempt,
        "events": [
            {"id": e.id, "name": e.name, "data": serde.loads(e.data), "ts": e.ts} for e in history.events
        ],
        "steps": [_step_json(s) for s in history.steps],
    }


def _step_json(step: StepRow) -> dict[str, Any]:
    return {
        "id": step.step_id,
        "position": step.position,
        "kind": str(step.kind),
        "fingerprint": step.fingerprint,
        "status": str(step.status),
        "attempts": step.attempts,
        "output": None if step.output is None else serde.loads(step.output),
        "error": None if step.error is None else serde.loads(step.error),
        "wake_at": step.wake_at,
    }


def from_json(doc: Any) -> RunHistory:
    """Read a document written by ``to_json``; ``ConfigError`` names what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError("histories", f"not a Stepstone history (expected format {FORMAT!r})")
    try:
        run_id = str(doc["run_id"])
        run = RunRow(
            id=run_id,
            function_id=str(doc["function_id"]),
            status=RunStatus(doc.get("status", RunStatus.RUNNING)),
            event_ids=[str(e["id"]) for e in doc["events"]],
            output=None,
            error=None,
            created_at=0.0,
            started_at=None,
            ended_at=None,
            attempt=int(doc.get("attempt", 0)),
            app_version=doc.get("app_version"),
            parent_run_id=None,
            parent_step_id=None,
        )
        events = [_event_row(i, e) for i, e in enumerate(doc["events"])]
        steps = [_step_row(run_id, s) for s in doc["steps"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("histories", f"history of run {doc.get('run_id')!r} is malformed: {exc}") from exc
    return RunHistory(run=run, events=events, steps=steps)


def _event_row(seq: int, event: dict[str, Any]) -> EventRow:
    return EventRow(
        seq=seq,
        id=str(event["id"]),
        name=str(event["name"]),
        data=serde.dumps(event["data"], what="event data"),
        ts=int(event["ts"]),
        received_at=0.0,
    )


def _step_row(run_id: str, step: dict[str, Any]) -> StepRow:
    output, error = step.get("output"), step.get("error")
    return StepRow(
        run_id=run_id,
        step_id=str(step["id"]),
        position=int(step["position"]),
        kind=StepKind(step["kind"]),
        status=StepStatus(step["status"]),
        attempts=int(step.get("attempts", 0)),
        output=None if output is None else serde.dumps(output, what="step output"),
        error=None if error is None else serde.dumps(error, what="step error"),
        wake_at=step.get("wake_at"),
        fingerprint=step.get("fingerprint"),
    )
