"""Reading a chaos scenario's side-effect ledger against the runs' memos and the
faults the harness injected: which step executions were legitimate, which were
re-executions a fault explains, and which broke the engine's promise.

Every execution of a chaos step writes ``start`` then ``end`` (or ``fail``, an
injected error) under a token of its own, and returns the token: the step's memo
therefore names the one execution whose checkpoint committed. For one step of one
run, in the order executions started:

- ``fail`` executions are retry attempts (and attempts after a replay): expected;
- the committed execution must be the last to start. An execution that started
  after it re-ran a *completed* step. So did one that started after any later
  step of the same run had started: that later step could only run once this
  step's memo existed (this catches a memo overwritten by a stale writer too);
- an execution that is neither committed nor the last one is *superseded*: its
  checkpoint never committed and the step ran again. That is the at-least-once
  boundary, expected when the executing process was killed, a worker was
  paused (it may hold a lock the executing process waits on), or the database
  restarted, between its start and the next execution's start.

A completed step re-run is reported with what may explain it: a worker paused
across it (resumed with the run as it leased it: the engine fences its commit
but does not stop it starting the step), or a restart (an ambiguous commit: it
may have succeeded while the client saw the connection drop). One that nothing
explains violates the engine's promise; so does a run that did not end by the deadline, and a
cancelled run that starts a second step before it is replayed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

ENDED = ("completed", "failed", "cancelled", "skipped")


@dataclass(frozen=True)
class Execution:
    run_id: str
    step: str
    token: str
    pid: int
    started: float
    phase: str  # "end", "fail", or "start" (interrupted: it never finished)


@dataclass
class FaultLog:
    """What the harness did, in wall-clock seconds (the ledger's clock)."""

    kills: list[tuple[int, float]] = field(default_factory=list)  # (pid, at)
    pauses: list[tuple[int, float, float]] = field(default_factory=list)  # (pid, stopped, resumed)
    restarts: list[tuple[str, float, float]] = field(default_factory=list)  # (mode, down, up)
    cancels: list[tuple[str, float]] = field(default_factory=list)  # (run id, when the cancel returned)
    replays: list[tuple[str, float]] = field(default_factory=list)  # (run id, when the replay was sent)
    hijacks: int = 0  # runs a paused worker held, cancelled (and replayed if they ended) while it was away

    def explain(self, pid: int, start: float, until: float) -> str | None:
        """The fault that explains an execution by ``pid`` started at ``start`` being
        executed again by an execution started at ``until``; None if no fault does."""
        if any(p == pid and start <= at <= until for p, at in self.kills):
            return "kill"
        # any worker's pause: a paused process may hold a lock the others wait on
        # (SQLite's write lock, a PostgreSQL row lock), so their heartbeats stall too
        if any(stopped <= until and resumed >= start for _, stopped, resumed in self.pauses):
            return "pause"
        if self.restart_between(start, until):
            return "restart"
        return None

    def rerun_cause(self, pid: int, completed: float, rerun: float) -> str:
        """What may explain a step completed by ``completed`` being executed again
        by ``pid`` at ``rerun``: a worker paused across that span resumed with the
        run's state as it leased it (``pause``), an ambiguous commit at a restart
        (``restart``), or nothing (``none``)."""
        if any(p == pid and stopped <= rerun and resumed >= completed for p, stopped, resumed in self.pauses):
            return "pause"
        return "restart" if self.restart_between(completed, rerun) else "none"

    def restart_between(self, start: float, until: float) -> bool:
        return any(down <= until and up >= start for _, down, up in self.restarts)


@dataclass(frozen=True)
class RunState:
    id: str
    status: str
    memo: dict[str, str]  # step id -> the committed execution's token (completed steps only)


@dataclass
class Verdict:
    """Every figure of one scenario on one backend."""

    runs_sent: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    stuck: list[tuple[str, str]] = field(default_factory=list)  # (run id, status) not ended by the deadline
    missing: int = 0  # sent, but no run exists
    executions: int = 0
    retried: int = 0  # injected failures, attempts that were retried (or replayed)
    superseded: Counter[str] = field(default_factory=Counter)  # by cause: kill, pause, restart, unexplained
    unexplained: list[tuple[str, str, int, float]] = field(
        default_factory=list
    )  # (run id, step, pid, started)
    reruns: list[tuple[str, str, str]] = field(default_factory=list)  # (run id, step, cause)
    ignored_cancels: list[tuple[str, list[str]]] = field(
        default_factory=list
    )  # (run id, steps started after)

    @property
    def lost(self) -> int:
        return len(self.stuck) + self.missing

    @property
    def unexplained_reruns(self) -> list[tuple[str, str, str]]:
        return [r for r in self.reruns if r[2] == "none"]

    def violations(self) -> list[str]:
        found = [f"run {run_id} not ended by the deadline: {status}" for run_id, status in self.stuck]
        if self.missing:
            found.append(f"{self.missing} sent event(s) started no run")
        found += [
            f"run {run_id}: completed step {step!r} executed again"
            for run_id, step, _ in self.unexplained_reruns
        ]
        found += [
            f"run {run_id}: steps {steps} started after it was cancelled"
            for run_id, steps in self.ignored_cancels
        ]
        return found


def executions(rows: Iterable[tuple[str, str, str, int, float, str | None]]) -> list[Execution]:
    """Ledger rows ``(run_id, step, phase, pid, at, token)`` in insertion order ->
    executions in the order they started."""
    started: dict[str, Execution] = {}
    for run_id, step, phase, pid, at, token in rows:
        if token is None:
            continue  # not a chaos step
        if phase == "start":
            started[token] = Execution(run_id, step, token, pid, at, "start")
        elif token in started:
            old = started[token]
            started[token] = Execution(old.run_id, old.step, token, old.pid, old.started, phase)
    return sorted(started.values(), key=lambda e: e.started)


def judge(
    sent: int, runs: Sequence[RunState], done: Sequence[Execution], faults: FaultLog, order: Sequence[str]
) -> Verdict:
    """The scenario's figures and verdict (``order``: the workflow's step ids in order)."""
    verdict = Verdict(runs_sent=sent, executions=len(done))
    verdict.missing = max(0, sent - len(runs))
    for run in runs:
        verdict.statuses[run.status] += 1
        if run.status not in ENDED:
            verdict.stuck.append((run.id, run.status))
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for e in done:
        by_run[e.run_id].append(e)
    memos = {run.id: run.memo for run in runs}
    for run_id, execs in by_run.items():
        _judge_run(verdict, execs, memos.get(run_id, {}), faults, order)
    _judge_cancels(verdict, by_run, faults)
    return verdict


def _judge_cancels(verdict: Verdict, by_run: dict[str, list[Execution]], faults: FaultLog) -> None:
    """A cancelled run finishes the step in flight and starts nothing after it, until
    it is replayed. The step in flight may have been decided on just before the
    cancel committed and so be logged just after it: one step is allowed, a
    second one means the cancel was lost."""
    for run_id, at in faults.cancels:
        replayed = min((t for r, t in faults.replays if r == run_id and t > at), default=float("inf"))
        steps = list(dict.fromkeys(e.step for e in by_run.get(run_id, []) if at < e.started < replayed))
        if len(steps) > 1:
            verdict.ignored_cancels.append((run_id, steps))


def _judge_run(
    verdict: Verdict, execs: list[Execution], memo: dict[str, str], faults: FaultLog, order: Sequence[str]
) -> None:
    for step in order:
        mine = [e for e in execs if e.step == step]
        later = [e.started for e in execs if e.step in order[order.index(step) + 1 :]]
        first_later = min(later, default=float("inf"))
        committed = next((e for e in mine if e.token == memo.get(step)), None)
        for i, e in enumerate(mine):
            if e.phase == "fail":
                verdict.retried += 1
            after = (
                committed.started
                if committed is not None and committed is not e and committed.started <= e.started
                else None
            )
            completed_by = after if after is not None else first_later if first_later <= e.started else None
            if completed_by is not None:
                verdict.reruns.append((e.run_id, step, faults.rerun_cause(e.pid, completed_by, e.started)))
            elif e is not committed and e.phase != "fail" and i + 1 < len(mine):
                until = mine[i + 1].started
                if any(e.started <= t <= until for t in later):
                    continue  # it committed: a later step ran on its memo (the re-run is counted above)
                cause = faults.explain(e.pid, e.started, until) or "unexplained"
                verdict.superseded[cause] += 1
                if cause == "unexplained":
                    verdict.unexplained.append((e.run_id, step, e.pid, e.started))
