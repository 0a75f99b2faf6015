"""The tables of the in-memory fake store (tests/fakes/memory.py), as records."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepstone.store.rows import EventRow, QueueSpec, RunRow, SpanRow, StepRow, WaitRow


@dataclass
class Item:
    """A queue row (``queue`` table)."""

    run_id: str
    function_id: str
    partition_key: str
    available_at: float | None  # None: parked until something wakes it
    sort_at: float
    ckey1: str | None = None
    limit1: int | None = None
    ckey2: str | None = None
    limit2: int | None = None
    throttle_key: str | None = None
    start_deadline: float | None = None
    finish_timeout: float | None = None
    epoch: int = 0
    owner: str | None = None
    fresh: bool = True
    wake_requested: bool = False
    cancel_requested: bool = False
    cancel_reason: str | None = None

    def live(self, now: float) -> bool:
        return self.owner is not None and self.available_at is not None and self.available_at > now

    def due(self, now: float) -> bool:
        return self.available_at is not None and self.available_at <= now


@dataclass
class Partition:
    function_id: str
    ckey: str | None
    next_at: float | None
    last_served: float = 0.0


@dataclass
class Run:
    row: RunRow
    epoch: int = 0
    written_by: str | None = None
    queue_spec: QueueSpec | None = None
    event_seqs: list[int] = field(default_factory=list)


@dataclass
class MemoryState:
    """Every table the fake keeps."""

    events: dict[int, EventRow] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    steps: dict[tuple[str, str], StepRow] = field(default_factory=dict)
    spans: list[SpanRow] = field(default_factory=list)
    queue: dict[str, Item] = field(default_factory=dict)
    partitions: dict[str, Partition] = field(default_factory=dict)
    gcra: dict[str, float] = field(default_factory=dict)
    accumulators: dict[tuple[str, str], tuple[str, int, float]] = field(default_factory=dict)
    keys: dict[str, tuple[str, float]] = field(default_factory=dict)
    waits: dict[int, WaitRow] = field(default_factory=dict)
    wait_keys: set[tuple[str, str]] = field(default_factory=set)
    key_versions: dict[tuple[str, str], int] = field(default_factory=dict)
    wait_versions: dict[int, int] = field(default_factory=dict)  # wait id -> the key version it took
    next_seq: int = 1
    next_wait: int = 1
