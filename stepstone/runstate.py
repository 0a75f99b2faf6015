"""A run's recorded state as a replay reads it: its memos' outputs, and their total.

A lease reads a run's step index, not its outputs (``LeasedRun``): a run with
a thousand large outputs would otherwise sit whole in the worker's memory at
every wake-up. The interpreter asks a ``MemoSource`` for a completed step's
output when the replay reaches that step. ``StoreMemos`` reads the store in
pages of consecutive steps (a sequential replay costs one round trip per
page, not per step) and forgets each output once handed over, so the handler
holds what it keeps and the engine at most one page. ``DictMemos`` serves
outputs already in memory: ``app.check``'s histories, or an endpoint that
received the memos in its request.

``StateBudget`` is the function's ``max_state``: the sum of the run's stored
outputs (as stored, after ``transform_output`` such as encryption), started
from the recorded outputs' sizes and charged as steps complete; the step whose
output would pass it fails with ``LimitExceededError``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from stepstone.errors import LimitExceededError
from stepstone.signals import LeaseLostSignal
from stepstone.sizes import stored_bytes
from stepstone.store.base import Store
from stepstone.store.rows import StepRow, StepStatus

PAGE_STEPS = 1024  # at most this many outputs per read (small outputs: a whole run in one)
PAGE_BYTES = 4 * 1024 * 1024  # and about this many bytes (at least one output)


class MemoSource(Protocol):
    """Where a replay reads the outputs of a run's completed steps."""

    def stored_bytes(self) -> int:
        """The stored size of every output the run has recorded, summed."""
        ...

    async def output(self, memo: StepRow) -> str | None:
        """The stored output of completed step ``memo`` (asked once per step)."""
        ...


class DictMemos:
    """Outputs already in memory, by step id."""

    def __init__(self, outputs: Mapping[str, str | None]) -> None:
        self._outputs = outputs

    @classmethod
    def of(cls, steps: Iterable[StepRow]) -> DictMemos:
        """The outputs full memos carry (a history, memos sent in a request)."""
        return cls({s.step_id: s.output for s in steps if s.output is not None})

    def stored_bytes(self) -> int:
        return sum(stored_bytes(text) for text in self._outputs.values() if text is not None)

    async def output(self, memo: StepRow) -> str | None:
        return self._outputs.get(memo.step_id)


class StoreMemos:
    """Outputs read from the store when the replay reaches them, a page at a time."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        steps: Sequence[StepRow],
        sizes: Mapping[str, int],
        *,
        page_steps: int = PAGE_STEPS,
        page_bytes: int = PAGE_BYTES,
    ) -> None:
        self.store, self.run_id, self.sizes = store, run_id, sizes
        self.page_steps, self.page_bytes = page_steps, page_bytes
        self._order = sorted((s for s in steps if s.status == StepStatus.COMPLETED), key=lambda s: s.position)
        self._index = {s.step_id: i for i, s in enumerate(self._order)}
        self._page: dict[str, str | None] = {}  # read, not handed over yet
        self._handed: set[str] = set()
        self._reading = asyncio.Lock()
        self.reads = 0  # round trips so far

    def stored_bytes(self) -> int:
        return sum(self.sizes.values())

    async def output(self, memo: StepRow) -> str | None:
        step_id = memo.step_id
        if step_id not in self._page:
            async with self._reading:  # parallel branches: one read serves both
                if step_id not in self._page:
                    await self._read_page(step_id)
        if step_id not in self._page:
            # Completed memos never change under a live lease: the run's
            # history went away (deleted), so this invocation must stop.
            raise LeaseLostSignal()
        self._handed.add(step_id)
        return self._page.pop(step_id)

    def _next_page(self, step_id: str) -> list[StepRow]:
        """The completed steps from ``step_id`` on that the replay has not been
        handed yet, up to a page's count and bytes."""
        start = self._index.get(step_id)
        if start is None:
            return []
        page: list[StepRow] = []
        size = 0
        for memo in self._order[start:]:
            if len(page) >= self.page_steps or (page and size >= self.page_bytes):
                break
            if memo.step_id in self._handed or memo.step_id in self._page:
                continue
            page.append(memo)
            size += self.sizes.get(memo.step_id, 0)
        return page

    async def _read_page(self, step_id: str) -> None:
        page = self._next_page(step_id)
        if not page:
            return
        run_id, first, last = self.run_id, page[0].position, page[-1].position
        outputs = await self.store.read(lambda tx: tx.step_outputs(run_id, first, last))
        self.reads += 1
        for memo in page:
            if memo.step_id in outputs:
                self._page[memo.step_id] = outputs[memo.step_id]


class StateBudget:
    """A run's stored outputs against its function's ``max_state`` (``None``: no cap).

    A ``step.transaction`` checks its output in the writer's thread while the
    event loop may be counting another step's: ``charge`` checks and counts
    in one critical section, so two parallel steps can never both pass."""

    def __init__(self, cap: int | None, used: int) -> None:
        self.cap, self.used = cap, used
        self._lock = threading.Lock()

    def check(self, step_id: str, output: str) -> None:
        """Raise ``LimitExceededError`` if ``output`` would take the run past the cap."""
        with self._lock:
            self._check(step_id, stored_bytes(output))

    def charge(self, step_id: str, output: str) -> int:
        """``check`` then ``count`` at once; returns the bytes counted (for ``refund``)."""
        size = stored_bytes(output)
        with self._lock:
            self._check(step_id, size)
            self.used += size
        return size

    def refund(self, size: int) -> None:
        """Take back a ``charge`` whose output was not recorded after all."""
        with self._lock:
            self.used -= size

    def count(self, output: str) -> None:
        """Add a recorded output (checked before, or written by another party:
        a wait's event, an invoked run's output, a signal's data)."""
        size = stored_bytes(output)
        with self._lock:
            self.used += size

    def _check(self, step_id: str, size: int) -> None:
        if self.cap is not None and self.used + size > self.cap:
            raise LimitExceededError(
                f"step {step_id!r}: its output ({size} bytes) would bring the run's stored state "
                f"to {self.used + size} bytes ({self.used} recorded), over the function's "
                f"max_state of {self.cap} bytes"
            )
