"""The flow role: the state admission reads and writes (debounce and batch
accumulators, idempotency and singleton keys; GCRA times through ``GcraTx``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from stepstone.store.roles.queue import GcraTx

AccumulatorKind = Literal["debounce", "batch"]  # a flow option that gathers events into one run


class FlowTx(GcraTx, Protocol):
    """Flow-control state admission reads and writes: debounce and batch
    accumulators, idempotency and singleton keys (and GCRA times)."""

    def claim_key(self, key: str, ref: str, expires_at: float, now: float) -> str | None:
        """Claim ``key`` until ``expires_at``. Returns ``None`` when claimed now,
        or the ``ref`` of the live claim that already holds it."""
        ...

    def release_key(self, key: str, ref: str) -> None:
        """Drop a claim if ``ref`` still holds it."""
        ...

    def get_accumulator(self, kind: AccumulatorKind, key: str) -> tuple[str, int, float] | None:
        """The open debounce or batch run for a key: (run id, size, first_at)."""
        ...

    def put_accumulator(
        self, kind: AccumulatorKind, key: str, run_id: str, size: int, first_at: float
    ) -> None:
        """Open (or update) the debounce or batch run of a key."""
        ...

    def close_batch(self, key: str) -> None:
        """Close a key's batch: the next event opens a new one."""
        ...

    def pending_item(self, run_id: str) -> bool:
        """Queued and never leased (a debounced or batching run may still change)."""
        ...

    def move_item(self, run_id: str, at: float, sort_at: float) -> None:
        """Change when a queued item is due."""
        ...

    def set_run_events(self, run_id: str, events: Sequence[tuple[int, str]], replace: bool) -> None:
        """Replace a run's event (debounce) or append one (batch)."""
        ...
