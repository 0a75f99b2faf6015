"""``app.check`` tells the threads of a plain ``def`` handler's parallel branches
apart even when the system reuses a finished thread's identifier for the next
thread (as Linux does): a branch that replayed to its end before its sibling's
thread started is not the sibling's branch."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from stepstone.checking import _NoServices, _ReadOnlyJournal, _Replay
from stepstone.clock import SystemClock
from stepstone.function import Backoff
from stepstone.store.rows import StepKind, StepRow, StepStatus


def _memo(step_id: str, position: int) -> StepRow:
    return StepRow(
        run_id="r",
        step_id=step_id,
        position=position,
        kind=StepKind.RUN,
        status=StepStatus.COMPLETED,
        output="null",
    )


def test_branches_in_threads_one_after_another_are_distinct_branches() -> None:
    for _round in range(20):  # the reuse is the system's choice: give it many chances
        _replay_three_branches_one_after_another()


def _replay_three_branches_one_after_another() -> None:
    # Recorded interleaved: a1, b1, a2, m1, b2. The replay runs each branch's
    # thread to its end before the next starts; glibc hands the third thread the
    # first one's identifier (threads alternate between two cached stacks).
    steps = [_memo("a1", 0), _memo("b1", 1), _memo("a2", 2), _memo("m1", 3), _memo("b2", 4)]
    with ThreadPoolExecutor(1) as threads:
        replay = _Replay(
            sync=True,
            run_id="r",
            steps=steps,
            journal=_ReadOnlyJournal(),
            clock=SystemClock(),
            retries=0,
            backoff=Backoff().validated(),
            threads=threads,
            services=_NoServices(),
        )
        idents = []
        for branch in (("a1", "a2"), ("m1",), ("b1", "b2")):

            def run(ids: tuple[str, ...] = branch) -> None:
                idents.append(threading.get_ident())
                for base in ids:
                    replay._in_order(replay.memo[replay.claim_id(base)])

            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
    assert replay.late is None, (replay.late, idents)
