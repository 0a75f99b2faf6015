"""When a run's recorded history no longer fits the code: one classifier for
every caller (``app.check`` today; pausing a run before a new step tomorrow).

A replay of a run's handler reaches its recorded steps (their memos answer)
until the first step the history does not hold a result for: a new step, or
a recorded one still sleeping, waiting or retrying. That is the *frontier*;
each parallel branch has its own, so the verdict waits until every branch
has stopped. What must not happen is that the replay stops while recorded
steps were never reached: the new code would go on with work the old run never
did, and leave behind work it did. Recorded steps must also be reached in
their recorded order, but only *within a branch* (an asyncio task, or a
thread of a plain ``def`` handler): across branches the recorded order is the
interleaving of one execution, and a replay, whose steps return at once,
interleaves differently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stepstone.store.rows import DivergenceReason


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """One run whose history does not fit the code now loaded (``ss.Divergence``)."""

    run_id: str
    function_id: str
    reason: DivergenceReason
    step_id: str | None = None  #: where the replay stopped (the unrecorded step reached), if anywhere
    missing: list[str] = field(default_factory=list)  #: recorded steps never reached, in recorded order
    message: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.run_id,
            "function_id": self.function_id,
            "reason": str(self.reason),
            "step_id": self.step_id,
            "missing": list(self.missing),
            "message": self.message,
        }


@dataclass(frozen=True, kw_only=True)
class ReplayOutcome:
    """What one replay of a handler saw, for ``classify``."""

    run_id: str
    function_id: str
    unreached: Mapping[str, int]  #: recorded step id -> position, never reached
    frontier: Sequence[str] = ()  #: where branches stopped, in the order reached
    changed: tuple[str, str] | None = None  #: (step id, why) of the first kind/fingerprint mismatch
    late: tuple[str, str] | None = None  #: (step id, the one after it) reached out of recorded order
    error: BaseException | None = None  #: what the handler raised outside any step


def classify(seen: ReplayOutcome) -> Divergence | None:
    """The divergence of a replay, or ``None`` when the history fits the code."""
    missing = sorted(seen.unreached, key=seen.unreached.__getitem__)
    if seen.changed is not None:
        changed_id, why = seen.changed
        return _divergence(seen, DivergenceReason.KIND_CHANGED, changed_id, missing, why)
    if seen.error is not None:
        why = f"{type(seen.error).__name__}: {seen.error}"
        return _divergence(seen, DivergenceReason.ERROR, None, missing, why)
    if seen.late is not None:
        late, after = seen.late
        why = f"the code reached recorded step {late!r} only after {after!r}, recorded after it"
        return _divergence(seen, DivergenceReason.NEW_STEP, None, [late], why)
    if not missing:
        return None
    step_id = seen.frontier[0] if seen.frontier else None
    where = f"stopped at {step_id!r}" if step_id else "returned"
    why = f"the code {where} without reaching recorded step(s) {', '.join(map(repr, missing))}"
    return _divergence(seen, DivergenceReason.NEW_STEP, step_id, missing, why)


def _divergence(
    seen: ReplayOutcome, reason: DivergenceReason, step_id: str | None, missing: list[str], message: str
) -> Divergence:
    return Divergence(
        run_id=seen.run_id,
        function_id=seen.function_id,
        reason=reason,
        step_id=step_id,
        missing=missing,
        message=message,
    )
