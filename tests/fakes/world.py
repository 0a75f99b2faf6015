"""A small world for the unit tier: an app's registry, the in-memory store and
a hand-driven clock, with the steps a worker takes (send events, lease, park,
finish) as one-line calls. Time never passes unless a test moves it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import stepstone as ss
from stepstone.executor import ExecEnv, Outcome, execute
from stepstone.registry import Registry
from stepstone.runtime import ingest, prepare
from stepstone.scheduler.leasing import lease
from stepstone.store.rows import Fence, LeasedRun, RunEnd, RunRow, RunStatus
from tests.fakes.memory import MemoryStore

T0 = 1_000_000.0


class _Clock:
    """The world's hand-moved time, as a ``Clock``."""

    def __init__(self, world: World) -> None:
        self.world = world

    def now(self) -> float:
        return self.world.now


class World:
    def __init__(self) -> None:
        self.app = ss.App("unit", database_url="sqlite:///never-opened.db")  # only its registry is used
        self.store = MemoryStore()
        self.now = T0
        self.threads = ThreadPoolExecutor(2)

    def handler(self, function_id: str, event: str | None = None, **options: Any) -> Callable[..., Any]:
        """Decorate a handler of ``function_id``, triggered by ``event`` (default: its id)."""
        return self.app.function(id=function_id, trigger=ss.on_event(event or function_id), **options)

    def execute(self, owner: str = "w") -> Outcome | None:
        """Lease the next due run and run one invocation of it, as a worker does."""
        [leased] = self.lease(owner, wanted=1)
        env = ExecEnv(
            self.store, self.registry, _Clock(self), owner, 30.0, self.threads, lambda: self.registry
        )
        return asyncio.run(execute(leased, env))

    @property
    def registry(self) -> Registry:
        return self.app.registry

    def function(self, function_id: str, event: str | None = None, **flow: Any) -> None:
        """Register a do-nothing function triggered by ``event`` (default: its id)."""
        self.app.function(id=function_id, trigger=ss.on_event(event or function_id), **flow)(lambda ctx: None)

    def send(self, name: str, data: dict[str, Any] | None = None, event_id: str | None = None) -> list[str]:
        """Ingest one event; returns the ids of the runs it created or joined."""
        before = set(self.store.state.runs)
        event = ss.Event(name, data or {}, id=event_id)
        self.store.transact_sync(lambda tx: ingest(tx, prepare(event, self.now), self.registry, self.now))
        return sorted(set(self.store.state.runs) - before)

    def lease(self, owner: str = "w", wanted: int = 10, ttl: float = 30.0) -> list[LeasedRun]:
        return self.store.transact_sync(
            lambda tx: lease(tx, owner, self.registry, wanted, self.now, self.now + ttl)
        )

    def leased_ids(self, owner: str = "w", wanted: int = 10, ttl: float = 30.0) -> list[str]:
        return [lr.run.id for lr in self.lease(owner, wanted, ttl)]

    def finish(self, leased: LeasedRun, owner: str = "w") -> bool:
        fence = Fence(run_id=leased.run.id, owner=owner, epoch=leased.epoch)
        ended: bool = self.store.transact_sync(
            lambda tx: tx.finish_run(
                RunEnd(
                    fence=fence,
                    run_id=leased.run.id,
                    status=RunStatus.COMPLETED,
                    output="null",
                    now=self.now,
                )
            )
        )
        return ended

    def run(self, run_id: str) -> RunRow:
        row: RunRow | None = self.store.read_sync(lambda tx: tx.get_run(run_id))
        assert row is not None, run_id
        return row

    def runs_of(self, function_id: str) -> list[RunRow]:
        return sorted(
            (r.row for r in self.store.state.runs.values() if r.row.function_id == function_id),
            key=lambda r: r.created_at,
        )

    def apply(self, op: Callable[[Any], Any]) -> Any:
        return self.store.transact_sync(op)
