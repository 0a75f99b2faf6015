"""The domain-level storage interface: ``Store`` and ``Tx``.

``Tx`` is the union of role protocols (``RunsTx``, ``QueueTx``, ``JournalTx``,
``WaitsTx``, ``FlowTx``, ``ViewsTx``, ``JobsTx``, ``AppsTx``, ...; one concern a module in
``store/roles/``, re-exported here): a consumer takes the one role it uses, so
its signature says what it may touch and a fake store need only implement the
roles its tests exercise. ``Tx`` is for the stores and for code that needs
most of them.

A ``Store`` runs *operations*: plain functions ``op(tx) -> T`` that call the
domain methods of a ``Tx`` inside one transaction. ``await store.transact(op)``
may share its transaction with other operations submitted at the same moment
(group commit); each caller still waits for its own commit, and an operation
that raises is rolled back alone. ``transact_sync`` runs one operation in its
own transaction from any thread.

Serialisation lives above this layer: values arrive and leave as JSON text.
All times are epoch seconds supplied by the caller, so the testing harness can
run on a virtual clock. Real-time callers read a clock corrected to the
database server's (``Tx.server_time``, ``stepstone.clocksync``), so every
process compares and writes times on one clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from stepstone.store.roles.apps import AppsTx
from stepstone.store.roles.flow import AccumulatorKind, FlowTx
from stepstone.store.roles.journal import ActionsTx, JournalTx
from stepstone.store.roles.mailbox import MailboxTx
from stepstone.store.roles.maintenance import CronTx, FunctionsTx, WorkersTx
from stepstone.store.roles.queue import GcraTx, LocksTx, QueueTx
from stepstone.store.roles.retention import RetentionTx
from stepstone.store.roles.runs import RunsTx
from stepstone.store.roles.views import JobsTx, ViewsTx
from stepstone.store.roles.waits import WaitsTx

__all__ = [
    "AccumulatorKind",
    "ActionsTx",
    "AppsTx",
    "CronTx",
    "FlowTx",
    "FunctionsTx",
    "GcraTx",
    "JobsTx",
    "JournalTx",
    "LocksTx",
    "MailboxTx",
    "Op",
    "QueueTx",
    "RetentionTx",
    "RunsTx",
    "Store",
    "Tx",
    "ViewsTx",
    "WaitsTx",
    "WorkersTx",
]

T = TypeVar("T")
Op = Callable[["Tx"], T]


class Tx(
    FunctionsTx,
    RunsTx,
    QueueTx,
    JournalTx,
    ActionsTx,
    WaitsTx,
    MailboxTx,
    FlowTx,
    CronTx,
    WorkersTx,
    ViewsTx,
    JobsTx,
    RetentionTx,
    AppsTx,
    Protocol,
):
    """Every domain operation inside one transaction: the union of the roles.
    Code that needs one role takes that role; ``Tx`` is for code that needs
    most of them (a store operation that ends a run) and for the stores."""


class Store(Protocol):
    """A database: runs operations in transactions."""

    dialect: str
    # whether its own commits that make work available call its subscribers
    # (PostgreSQL); when not, the app pokes its local workers after its writes
    wakes_own_subscribers: bool

    async def transact(self, op: Callable[[Tx], T]) -> T:
        """Run ``op`` in a (possibly shared) write transaction on the current loop."""
        ...

    def submit(self, op: Callable[[Tx], T]) -> asyncio.Future[T]:
        """Like ``transact`` but returns the future at once (call on the loop)."""
        ...

    def transact_sync(self, op: Callable[[Tx], T]) -> T:
        """Run ``op`` in its own write transaction, from any thread."""
        ...

    async def read(self, op: Callable[[Tx], T]) -> T:
        """Run a read-only ``op``."""
        ...

    def read_sync(self, op: Callable[[Tx], T]) -> T:
        """Run a read-only ``op`` from any thread."""
        ...

    def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied."""
        ...

    def change_token(self) -> Any:
        """A cheap value that changes when another connection commits (for idle polling)."""
        ...

    def subscribe(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """Call ``callback`` (from any thread) when another connection may have
        made work available; returns a function that unsubscribes. PostgreSQL
        pushes these (LISTEN/NOTIFY); SQLite never calls back: its workers poll
        ``change_token`` while idle."""
        ...

    def close(self) -> None:
        """Close the store's connections (and its writer and listener threads)."""
        ...
