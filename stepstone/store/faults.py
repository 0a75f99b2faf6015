"""Fault injection at every commit site, for tests only.

A durable-execution engine must survive a write that fails *before* its
commit (nothing happened) and, harder, one that fails *after* it: the
transaction committed but the client saw the connection die, so it cannot
know and retries. This module lets a test fail any named write operation in
either way, on both stores, to prove that every retry is harmless.

Every write transaction goes through ``SqliteStore.write_batch`` or
``PostgresStore._write_batch``; each checks ``faults.active`` (one module
attribute read, ``None`` in production) and, only when a plan is installed,
hands its batch to it. Nothing outside a test installs one: the only way is
the ``inject``, ``inject_all`` and ``recording`` context managers below.

Operations are named by ``site``: an explicit ``site`` attribute if the
operation has one (the run journal names each commit after its parts, e.g.
``journal(checkpoint+invoke.start_child)``), else its qualified
name without ``<locals>`` (``Worker._lease.op``). Names are stable across
runs, so a test can record the sites of a workload, then fail each in turn::

    with faults.recording() as seen:
        workload()
    for site in seen.sites:
        for when in ("before", "after"):
            with faults.inject(site, when) as plan:
                workload()
            assert plan.fired
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from stepstone.errors import StoreUnavailableError
from stepstone.store.batching import OpResult
from stepstone.store.batching import site as site  # a write operation's name, which plans match

When = Literal["before", "inside", "after"]
Op = Callable[[Any], Any]

active: Plan | None = None  # read by the stores on every write transaction


@dataclass(frozen=True)
class Fault:
    """Fail the ``nth`` write named ``site`` ``when`` (``before``: the operation
    raises and is rolled back alone; ``inside``: the operation runs, then the
    plan's ``during()`` runs in its still open transaction, before its
    ``COMMIT`` (where a test kills the process: after a step's work, before
    its checkpoint commits); ``after``: its batch commits and every operation
    in it then gets ``StoreUnavailableError``, as if the connection died at
    ``COMMIT``)."""

    site: str
    when: When
    nth: int = 1


class Plan:
    """The faults still to inject; records every site written to."""

    def __init__(self, faults: Sequence[Fault] = (), during: Callable[[], Any] | None = None) -> None:
        self.pending = {(f.site, f.nth): f for f in faults}
        self.during = during
        self.injected: list[Fault] = []
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def fired(self) -> bool:
        """Whether every planned fault was injected."""
        with self._lock:
            return not self.pending

    @property
    def sites(self) -> list[str]:
        """Every site seen so far, in the order first seen."""
        with self._lock:
            return list(self.seen)

    def run(self, ops: Sequence[Op], write: Callable[[list[Op]], list[OpResult]]) -> list[OpResult]:
        """Run one batch through ``write`` with the faults that are due."""
        hits = self._hits(ops)
        if not hits:
            return write(list(ops))
        wrapped = [_wrapped(op, hits.get(i), self.during) for i, op in enumerate(ops)]
        outcomes = write(wrapped)
        after = [i for i, when in hits.items() if when == "after"]
        if not after:
            return outcomes
        if self.during is not None:
            self.during()
        lost = _lost(ops[after[0]])
        return [(False, lost) for _ in outcomes]

    def _hits(self, ops: Sequence[Op]) -> dict[int, When]:
        with self._lock:
            hits: dict[int, When] = {}
            for index, op in enumerate(ops):
                name = site(op)
                self.seen[name] += 1
                fault = self.pending.pop((name, self.seen[name]), None)
                if fault is not None:
                    self.injected.append(fault)
                    hits[index] = fault.when
            return hits


def _wrapped(op: Op, when: When | None, during: Callable[[], Any] | None) -> Op:
    if when == "before":
        return _failing(op)
    if when == "inside" and during is not None:
        return _Inside(op, during)
    return op


class _Inside:
    """The operation, then ``during()`` inside its open transaction; otherwise
    the operation itself (its ``site``, whether it runs user SQL)."""

    def __init__(self, op: Op, during: Callable[[], Any]) -> None:
        self.op, self.during = op, during

    def __call__(self, tx: Any) -> Any:
        value = self.op(tx)
        self.during()
        return value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.op, name)


def _failing(op: Op) -> Op:
    def before(tx: Any) -> Any:
        raise StoreUnavailableError(f"injected fault before the commit of {site(op)}")

    return before


def _lost(op: Op) -> StoreUnavailableError:
    return StoreUnavailableError(f"injected fault: connection lost at the COMMIT of {site(op)}")


@contextmanager
def inject(target: str, when: When, nth: int = 1, during: Callable[[], Any] | None = None) -> Iterator[Plan]:
    """Install a plan failing the ``nth`` write named ``target``, for the block.
    ``during()``, if given, runs inside an "inside" fault's transaction before
    its ``COMMIT``, or after an "after" fault's commit and before its
    caller hears of the failure: what other clients do while this one cannot
    know whether its write committed (it runs on the writing thread; it may
    write through ``Store.transact_sync``)."""
    yield from _installed(Plan([Fault(target, when, nth)], during))


@contextmanager
def inject_all(planned: Sequence[Fault], during: Callable[[], Any] | None = None) -> Iterator[Plan]:
    """Install a plan injecting every fault of ``planned`` (as ``inject``)."""
    yield from _installed(Plan(planned, during))


@contextmanager
def recording() -> Iterator[Plan]:
    """Install a plan that fails nothing and records the sites written to."""
    yield from _installed(Plan())


def _installed(plan: Plan) -> Iterator[Plan]:
    global active
    if active is not None:
        raise RuntimeError("a fault plan is already installed")
    active = plan
    try:
        yield plan
    finally:
        active = None
