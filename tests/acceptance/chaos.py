"""Chaos scenarios: `stepstone worker` processes draining chaos runs (see
``ledger_app.chaos``) while the harness kills, pauses and restarts things and
an operator cancels and replays runs. The verdict comes from ``chaos_ledger``.

Shared by ``bench/chaos.py`` (figures of a reasonable size) and
``tests/acceptance/test_chaos.py`` (a short storm in the suite). Faults are drawn
from a seeded ``random.Random``; their timing against the workers' progress is
not reproducible, the figures' distribution is.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import stepstone as ss
from stepstone.errors import InvalidStateError, StoreUnavailableError
from stepstone.store.rows import ACTIVE_STATUSES

from .chaos_ledger import FaultLog, RunState, Verdict, executions, judge
from .procs import client, create_ledger, migrated, wait_for

HERE = Path(__file__).parent
STEPSTONE = str(Path(sys.executable).parent / "stepstone")
ORDER = ("charge", "record", "provision")  # ledger_app.CHAOS_STEPS (not imported: it needs a database)
SCENARIOS = ("storm", "pause", "restart", "mix")
# A client's reads and operator actions may fail while PostgreSQL is down.
TRANSIENT: tuple[type[BaseException], ...] = (StoreUnavailableError, OSError)


class Restartable(Protocol):
    """The PostgreSQL server (``tests.pgcluster.PgCluster``), for the restart scenarios."""

    def stop_server(self, mode: str = "fast") -> None: ...

    def start(self) -> None: ...


@dataclass(frozen=True)
class Config:
    runs: int = 300
    workers: int = 3
    concurrency: int = 4  # per worker process
    lease_ttl: float = 2.0
    step_seconds: float = 0.2  # each step side effect
    fail_rate: float = 0.25  # per attempt of the flaky step (two attempts: ~6 % of runs fail)
    fault_seconds: float = 60.0  # faults stop after this; the drain goes on to the deadline
    deadline: float = 180.0  # from the first run sent; runs not ended by then are lost/stuck
    kill_every: float = 0.7  # mean seconds between SIGKILLs
    pause_every: float = 1.5  # mean seconds between the end of a pause and the next SIGSTOP
    restart_every: float = 6.0  # mean seconds between PostgreSQL restarts
    restart_down: float = 1.0  # seconds the server stays down
    operator_every: float = 1.0  # mean seconds between operator actions (mix)
    cancel_fraction: float = 0.1  # of the runs, cancelled over the fault phase (mix)
    seed: int = 1


@dataclass
class Outcome:
    scenario: str
    backend: str
    config: Config
    verdict: Verdict
    faults: FaultLog
    wall_seconds: float
    committed_steps: int
    log: str = ""

    def figures(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "scenario": self.scenario,
            "backend": self.backend,
            "runs_sent": v.runs_sent,
            "completed": v.statuses["completed"],
            "failed": v.statuses["failed"],
            "cancelled": v.statuses["cancelled"],
            "lost_or_stuck": v.lost,
            "stuck": [list(s) for s in v.stuck],
            "kills": len(self.faults.kills),
            "pauses": len(self.faults.pauses),
            "restarts": len(self.faults.restarts),
            "cancels": len(self.faults.cancels),
            "replays": len(self.faults.replays),
            "hijacks": self.faults.hijacks,
            "cancels_not_honoured": len(v.ignored_cancels),
            "step_executions": v.executions,
            "retried_attempts": v.retried,
            "re_executed_at_kill": v.superseded["kill"],
            "re_executed_at_pause": v.superseded["pause"],
            "re_executed_at_restart": v.superseded["restart"],
            "re_executed_unexplained": v.superseded["unexplained"],
            "completed_steps_rerun": len(v.reruns),
            "completed_steps_rerun_at_pause": sum(1 for r in v.reruns if r[2] == "pause"),
            "completed_steps_rerun_at_restart": sum(1 for r in v.reruns if r[2] == "restart"),
            "completed_steps_rerun_unexplained": len(v.unexplained_reruns),
            "reruns": [list(r) for r in v.reruns],
            "unexplained_re_executions": [list(u) for u in v.unexplained],
            "fault_log": {
                "kills": self.faults.kills,
                "pauses": self.faults.pauses,
                "restarts": self.faults.restarts,
            },
            "wall_seconds": round(self.wall_seconds, 1),
            "steps_per_second": round(self.committed_steps / self.wall_seconds, 1)
            if self.wall_seconds
            else 0.0,
            "violations": v.violations(),
        }


class Fleet:
    """``size`` worker processes on one database; a killed one is replaced at once."""

    def __init__(self, env: dict[str, str], size: int, args: list[str], log: IO[bytes]) -> None:
        self.env, self.args, self.log = env, args, log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []  # instance ids, by slot
        self.started = 0
        for _ in range(size):
            self.procs.append(self._spawn())
            self.names.append(f"chaos-{self.started}")

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        return subprocess.Popen(
            [
                STEPSTONE,
                "--log-level",
                "WARNING",
                "worker",
                "ledger_app:app",
                *self.args,
                "--instance-id",
                f"chaos-{self.started}",
            ],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def kill(self, slot: int) -> tuple[int, float]:
        proc = self.procs[slot]
        proc.send_signal(signal.SIGKILL)
        at = time.time()
        proc.wait()
        self.procs[slot] = self._spawn()
        self.names[slot] = f"chaos-{self.started}"
        return proc.pid, at

    def signal(self, slot: int, sig: signal.Signals) -> int:
        self.procs[slot].send_signal(sig)
        return self.procs[slot].pid

    def stop(self, drain: float = 30) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(drain)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Chaos:
    """The fault schedule of one scenario, one tick at a time."""

    scenario: str
    url: str
    config: Config
    fleet: Fleet
    app: ss.App
    run_ids: list[str]
    cluster: Restartable | None
    rng: random.Random
    faults: FaultLog = field(default_factory=FaultLog)
    due: dict[str, float] = field(default_factory=dict)
    pause: threading.Timer | None = None
    paused: tuple[int, int, float] = (-1, 0, 0.0)  # (slot, pid, stopped at)
    lock: threading.RLock = field(default_factory=threading.RLock)
    victims: list[str] = field(default_factory=list)  # runs the paused worker held when it stopped
    modes: Iterator[str] = field(default_factory=lambda: iter(()))

    def __post_init__(self) -> None:
        now = time.monotonic()
        c = self.config
        wanted = {
            "storm": {"kill": c.kill_every},
            "pause": {"pause": c.pause_every},
            "restart": {"restart": c.restart_every},
            "mix": {
                "kill": c.kill_every * 2,
                "pause": c.pause_every * 2,
                "cancel": c.operator_every,
                "replay": c.operator_every * 2,
                **({"restart": c.restart_every * 2} if self.cluster else {}),
            },
        }[self.scenario]
        self.every = wanted
        self.due = {kind: now + self.rng.uniform(0.3, 1.0) * mean for kind, mean in wanted.items()}
        self.modes = _cycle(("fast", "immediate"))

    def tick(self) -> None:
        now = time.monotonic()
        for kind, at in list(self.due.items()):
            if now >= at:
                getattr(self, f"_{kind}")()
                if kind == "hijack":
                    del self.due[kind]
                elif kind != "pause":
                    self.due[kind] = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.every[kind]

    def finish(self) -> None:
        """No more faults: resume a paused worker now (a restart is synchronous)."""
        self.due.clear()
        with self.lock:
            if self.pause is not None:
                self.pause.cancel()
                self._resume()

    def _resume(self) -> None:
        """SIGCONT the paused worker, on a timer: a harness blocked on the database
        (a SQLite write lock the paused process holds) must not stretch the pause."""
        with self.lock:
            if self.pause is None:
                return
            slot, pid, stopped = self.paused
            self.fleet.signal(slot, signal.SIGCONT)
            self.faults.pauses.append((pid, stopped, time.time()))
            self.pause = None
            if "pause" in self.due:
                self.due["pause"] = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.every["pause"]

    def _kill(self) -> None:
        slot = self.rng.randrange(len(self.fleet.procs))
        if self.pause is not None and self.paused[0] == slot:
            return  # killing a paused worker is a plain kill: keep the pause's figures clean
        self.faults.kills.append(self.fleet.kill(slot))

    def _pause(self) -> None:
        self.due["pause"] = float("inf")  # one pause at a time; rescheduled at the resume
        slot = self.rng.randrange(len(self.fleet.procs))
        with self.lock:
            pid = self.fleet.signal(slot, signal.SIGSTOP)
            self.paused = (slot, pid, time.time())
            hold = self.config.lease_ttl * self.rng.uniform(1.3, 2.0)  # past the lease: the run moves on
            self.pause = threading.Timer(hold, self._resume)
            self.pause.start()
        if self.scenario == "mix":  # the operator acts on the paused worker's runs while it is away
            self.victims = owned_runs(self.url, self.fleet.names[slot])
            self.due["hijack"] = time.monotonic() + hold * self.rng.uniform(0.3, 0.9)

    def _restart(self) -> None:
        assert self.cluster is not None
        down = time.time()
        mode = next(self.modes)
        self.cluster.stop_server(mode)
        time.sleep(self.config.restart_down)  # the outage itself, not a wait for anything
        self.cluster.start()
        self.faults.restarts.append((mode, down, time.time()))

    def _cancel(self) -> None:
        """Cancel a sample of runs; replay some of them at once (cancel + replay of a
        run a worker still executes is what broke the engine in the review)."""
        per_tick = max(
            1,
            round(
                self.config.cancel_fraction
                * len(self.run_ids)
                * self.every["cancel"]
                / self.config.fault_seconds
            ),
        )
        for run_id in self.rng.sample(self.run_ids, min(per_tick, len(self.run_ids))):
            with contextlib.suppress(*TRANSIENT, InvalidStateError):
                self.app.runs.cancel(run_id)
                self.faults.cancels.append((run_id, time.time()))
                if self.rng.random() < 0.5:
                    self._replay_one(run_id)

    def _hijack(self) -> None:
        """Cancel and at once replay the runs a paused worker held (the review's attack:
        the paused worker resumes with a stale invocation of a run that began again)."""
        for run_id in self.victims:
            with contextlib.suppress(*TRANSIENT, InvalidStateError):
                self.app.runs.cancel(run_id)
                self.faults.cancels.append((run_id, time.time()))
                self.faults.hijacks += 1
                self._replay_one(run_id)

    def _replay(self) -> None:
        with contextlib.suppress(*TRANSIENT):
            ended = self.app.runs.list(function_id="chaos", status=["failed", "cancelled"], limit=1000)
            for run in self.rng.sample(ended, len(ended) // 2):
                self._replay_one(run.id)

    def _replay_one(self, run_id: str) -> None:
        sent = time.time()
        with contextlib.suppress(*TRANSIENT, InvalidStateError):
            self.app.runs.replay(run_id)
            self.faults.replays.append((run_id, sent))


def _cycle(items: tuple[str, ...]) -> Iterator[str]:
    while True:
        yield from items


def owned_runs(url: str, instance_id: str) -> list[str]:
    """Runs whose lease a worker (by instance id) holds, straight from the database."""
    sql = "SELECT run_id FROM queue WHERE owner LIKE '" + instance_id + "/%'"
    with contextlib.suppress(Exception):
        if url.startswith("sqlite:"):
            with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0])) as conn:
                return [row[0] for row in conn.execute(sql)]
        import psycopg

        with psycopg.connect(url, connect_timeout=2) as pg:
            return [row[0] for row in pg.execute(sql.encode())]
    return []


def active_runs(url: str) -> int | None:
    """Runs not ended yet, straight from the database (None while it is unreachable)."""
    marks = ", ".join(f"'{s}'" for s in ACTIVE_STATUSES)
    sql = f"SELECT COUNT(*) FROM runs WHERE status IN ({marks})"
    try:
        if url.startswith("sqlite:"):
            with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///").split("?")[0])) as conn:
                return int(conn.execute(sql).fetchone()[0])
        import psycopg

        with psycopg.connect(url, connect_timeout=2) as pg:
            row = pg.execute(sql.encode()).fetchone()
            return int(row[0]) if row else 0
    except Exception:  # noqa: BLE001 - the database is being restarted: no answer yet
        return None


def _retry(read: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except TRANSIENT:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _all_runs(app: ss.App) -> list[RunState]:
    runs: list[RunState] = []
    before: str | None = None
    while True:
        page = _retry(lambda: app.runs.list(function_id="chaos", limit=1000, before=before))
        runs += [
            RunState(
                r.id,
                r.status,
                {s.id: s.output for s in r.steps if s.kind == "run" and s.status == "completed"},
            )
            for r in page
        ]
        if len(page) < 1000:
            return runs
        before = page[-1].id


def run_scenario(
    scenario: str, backend: str, url: str, workdir: Path, config: Config, cluster: Restartable | None = None
) -> Outcome:
    """Run one scenario to its end (every run ended, or the deadline) and judge it."""
    if scenario == "restart" and cluster is None:
        raise ValueError("the restart scenario needs a PostgreSQL server it may restart")
    workdir.mkdir(parents=True, exist_ok=True)
    migrated(url)
    ledger_path = workdir / f"{scenario}-{backend}-ledger.db"
    ledger_path.unlink(missing_ok=True)
    create_ledger(str(ledger_path))
    env = {
        **os.environ,
        "STEPSTONE_DATABASE_URL": url,
        "LEDGER_PATH": str(ledger_path),
        "PYTHONPATH": str(HERE),
        "STEP_SECONDS": str(config.step_seconds),
        "CHAOS_FAIL_RATE": str(config.fail_rate),
    }
    log_path = workdir / f"{scenario}-{backend}-workers.log"
    app = client(env)
    with log_path.open("wb") as log:
        fleet = Fleet(
            env,
            config.workers,
            ["--concurrency", str(config.concurrency), "--lease-ttl", str(config.lease_ttl)],
            log,
        )
        try:
            rng = random.Random(config.seed)
            wait_for(lambda: len(_retry(app.workers.list)) >= config.workers, 60, "the workers to register")
            _send(app, config.runs)
            started = time.monotonic()
            run_ids = [r.id for r in _all_runs(app)]
            chaos = Chaos(scenario, url, config, fleet, app, run_ids, cluster, rng)
            while time.monotonic() - started < config.deadline and active_runs(url) != 0:
                if time.monotonic() - started < config.fault_seconds:
                    chaos.tick()
                else:
                    chaos.finish()
                time.sleep(0.05)  # the harness's tick: faults are due at random times
            chaos.finish()
            wall = time.monotonic() - started
        finally:
            fleet.stop()
    runs = _all_runs(app)
    app.close()
    with contextlib.closing(sqlite3.connect(ledger_path)) as conn:
        done = executions(
            conn.execute("SELECT run_id, step, phase, pid, at, token FROM ledger ORDER BY rowid")
        )
    verdict = judge(config.runs, runs, done, chaos.faults, ORDER)
    committed = sum(len(r.memo) for r in runs)
    return Outcome(scenario, backend, config, verdict, chaos.faults, wall, committed, log_path.read_text())


def _send(app: ss.App, runs: int) -> None:
    for start in range(0, runs, 500):
        app.send([ss.Event("chaos", id=f"chaos-{i}") for i in range(start, min(runs, start + 500))])
