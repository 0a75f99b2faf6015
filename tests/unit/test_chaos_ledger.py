"""The chaos suite's judge (tests/acceptance/chaos_ledger.py) on hand-written
ledgers: each kind of re-execution is told apart, and each violation is caught."""

from __future__ import annotations

from tests.acceptance.chaos_ledger import Execution, FaultLog, RunState, Verdict, executions, judge

ORDER = ("a", "b")


def ex(token: str, step: str, pid: int, at: float, phase: str = "end", run: str = "r") -> Execution:
    return Execution(run, step, token, pid, at, phase)


def verdict(
    done: list[Execution], memo: dict[str, str], faults: FaultLog | None = None, status: str = "completed"
) -> Verdict:
    return judge(1, [RunState("r", status, memo)], done, faults or FaultLog(), ORDER)


def test_the_ledger_is_read_as_executions_in_start_order() -> None:
    rows = [
        ("r", "a", "start", 1, 2.0, "t2"),
        ("r", "a", "start", 1, 1.0, "t1"),
        ("r", "a", "end", 1, 3.0, "t1"),
        ("r", "a", "fail", 1, 3.0, "t2"),
        ("r", "x", "start", 1, 0.5, None),
    ]
    assert executions(rows) == [ex("t1", "a", 1, 1.0), ex("t2", "a", 1, 2.0, "fail")]


def test_a_clean_run_and_its_retries_are_no_re_execution() -> None:
    v = verdict(
        [ex("1", "a", 7, 1.0, "fail"), ex("2", "a", 7, 2.0), ex("3", "b", 7, 3.0)], {"a": "2", "b": "3"}
    )
    assert (v.retried, sum(v.superseded.values()), v.reruns, v.violations()) == (1, 0, [], [])


def test_a_step_in_flight_at_a_fault_is_attributed_to_it() -> None:
    done = [ex("1", "a", 7, 1.0, "start"), ex("2", "a", 8, 5.0), ex("3", "b", 8, 6.0)]
    memo = {"a": "2", "b": "3"}
    assert verdict(done, memo, FaultLog(kills=[(7, 2.0)])).superseded == {"kill": 1}
    assert verdict(done, memo, FaultLog(kills=[(7, 5.5)])).superseded == {
        "unexplained": 1
    }  # after the takeover
    assert verdict(done, memo, FaultLog(pauses=[(7, 1.5, 4.0)])).superseded == {"pause": 1}
    assert verdict(done, memo, FaultLog(pauses=[(9, 1.5, 4.0)])).superseded == {"pause": 1}  # a lock holder
    assert verdict(done, memo, FaultLog(pauses=[(7, 0.1, 0.9)])).superseded == {"unexplained": 1}
    assert verdict(done, memo, FaultLog(restarts=[("fast", 3.0, 4.0)])).superseded == {"restart": 1}
    assert verdict(done, memo).superseded == {"unexplained": 1}
    assert verdict(done, memo).violations() == []  # superseded executions are at-least-once, not a violation


def test_an_execution_after_the_committed_one_is_a_completed_step_re_run() -> None:
    done = [ex("1", "a", 7, 1.0), ex("2", "a", 8, 5.0)]
    v = verdict(done, {"a": "1"}, FaultLog(kills=[(7, 2.0)]))  # a kill does not excuse it
    assert v.reruns == [("r", "a", "none")]
    assert v.violations() == ["run r: completed step 'a' executed again"]
    v = verdict(done, {"a": "1"}, FaultLog(restarts=[("immediate", 2.0, 3.0)]))  # an ambiguous commit
    assert (v.reruns, v.violations()) == ([("r", "a", "restart")], [])
    v = verdict(done, {"a": "1"}, FaultLog(pauses=[(8, 0.5, 4.0)]))  # a stale worker, resumed
    assert (v.reruns, v.violations()) == ([("r", "a", "pause")], [])
    v = verdict(done, {"a": "1"}, FaultLog(pauses=[(8, 0.2, 0.9)]))  # resumed before the step completed
    assert v.reruns == [("r", "a", "none")]


def test_a_step_re_run_after_a_later_step_started_is_caught_even_if_its_memo_was_overwritten() -> None:
    done = [ex("1", "a", 7, 1.0), ex("2", "b", 7, 2.0), ex("3", "a", 8, 5.0)]
    v = verdict(done, {"a": "3", "b": "2"}, FaultLog(pauses=[(7, 2.5, 9.0)]))
    assert v.reruns == [("r", "a", "none")] and v.superseded == {}


def test_a_run_not_ended_or_never_created_is_lost() -> None:
    v = verdict([], {}, status="sleeping")
    assert v.stuck == [("r", "sleeping")] and v.lost == 1
    v = judge(3, [RunState("r", "completed", {})], [], FaultLog(), ORDER)
    assert v.missing == 2 and v.violations() == ["2 sent event(s) started no run"]


def test_a_cancelled_run_may_finish_the_step_in_flight_but_start_nothing_else_until_replayed() -> None:
    done = [ex("1", "a", 7, 1.0), ex("2", "b", 7, 2.5), ex("3", "b", 7, 9.0, run="other")]
    assert verdict(done, {"a": "1", "b": "2"}, FaultLog(cancels=[("r", 2.0)])).ignored_cancels == []
    v = verdict(done, {"a": "1", "b": "2"}, FaultLog(cancels=[("r", 0.5)]))  # a and b both started after
    assert v.ignored_cancels == [("r", ["a", "b"])]
    assert v.violations() == ["run r: steps ['a', 'b'] started after it was cancelled"]
    replayed = FaultLog(cancels=[("r", 0.5)], replays=[("r", 0.8)])
    assert verdict(done, {"a": "1", "b": "2"}, replayed).ignored_cancels == []
