"""The shape every flow-control option shares, and what admission hands it.

An :class:`Option` is one keyword of ``@app.function`` (``throttle=``,
``concurrency=``, ...): it checks the user's value, resolves it into a
:class:`Rule` (a frozen, validated record) and rebuilds the value from the
function's stored description. A rule's hooks are called by
``runtime.admission`` in the order of ``stepstone.flow.POLICIES``, each a no-op
unless the rule overrides it:

- ``admit``: may end the admission (the event joined a pending run, or is a
  duplicate) or record the new run ``skipped``; the first verdict wins (a
  rule may also note a claim it made on the placement);
- ``priority``: seconds that move the run ahead in its queue;
- ``place``: the new run's due time, queue placement and deadlines;
- ``opened``: rows written once a run that is not skipped exists.

Admission is the :class:`Admission` protocol, so that a rule reaches the
effects that live above it (cancelling a run, a cancel wait) without importing
them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from stepstone.errors import ConfigError
from stepstone.expressions import Expression
from stepstone.store.base import Tx
from stepstone.store.rows import QueueSpec
from stepstone.triggers import Trigger

NULL_KEY = json.dumps(None)  # Admission.key of an expression that yields nothing


class Admission(Protocol):
    """One event (or batch of events) being admitted to one function."""

    @property
    def tx(self) -> Tx: ...

    @property
    def function_id(self) -> str: ...

    @property
    def now(self) -> float: ...

    @property
    def run_id(self) -> str:
        """The id the new run gets, if one is created."""
        ...

    @property
    def variables(self) -> dict[str, Any]: ...

    @property
    def last_event(self) -> tuple[int, str]:
        """The last event's ``(seq, id)``: what a joined run receives."""
        ...

    def key(self, expression: Expression | None) -> str:
        """Canonical JSON of ``expression`` over the event (``NULL_KEY`` without one)."""
        ...

    def sort_at(self, due: float) -> float:
        """The queue order of a run due at ``due``: earlier by its priority."""
        ...

    def cancel(self, run_id: str, message: str) -> None:
        """Cancel another run (cancelled at once, or flagged if a worker holds it)."""
        ...

    def add_cancel_wait(
        self, *, step_id: str, event_name: str, condition: str | None, expires_at: float | None, field: str
    ) -> None:
        """A wait that cancels the new run when a matching event arrives."""
        ...


@dataclass(kw_only=True)
class Placement:
    """The new run as the rules shape it before it is written."""

    due: float
    skipped: str | None = None  # why the run is recorded skipped (None: it is queued)
    slots: list[tuple[str, int]] = field(default_factory=list)  # concurrency keys, limits
    throttle_key: str | None = None
    start_deadline: float | None = None
    finish_timeout: float | None = None
    singleton_key: str | None = None

    def queue_spec(self, function_id: str) -> QueueSpec:
        """The run's partition is its function and first concurrency key (so a
        full key parks only its own partition)."""
        if not self.slots and self.throttle_key is None:
            return _plain_spec(function_id)
        padded: list[tuple[str | None, int | None]] = [*self.slots, (None, None), (None, None)]
        (ckey1, limit1), (ckey2, limit2) = padded[:2]
        return QueueSpec(
            partition_key=function_id if ckey1 is None else f"{function_id}|{ckey1}",
            ckey1=ckey1,
            limit1=limit1,
            ckey2=ckey2,
            limit2=limit2,
            throttle_key=self.throttle_key,
        )


@functools.lru_cache(maxsize=4096)
def _plain_spec(function_id: str) -> QueueSpec:
    """The spec of a run queued without keys or throttle: its function's
    partition. Made once per function (the spec is frozen: shared by its runs)."""
    return QueueSpec(partition_key=function_id)


@dataclass(frozen=True, kw_only=True)
class Joined:
    """The event joined a pending run (debounce, batch): no new run."""

    run_id: str


@dataclass(frozen=True, kw_only=True)
class Dropped:
    """A duplicate (idempotency): no run at all."""


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A run is created but recorded ``skipped``, with this reason."""

    reason: str


Verdict = Joined | Dropped | Skipped


class Rule:
    """A resolved flow-control setting; subclasses are frozen keyword-only
    dataclasses and override the hooks they need."""

    # Whether a run of the function may be started in the transaction that
    # sends it, by a worker of the sending process (app.py's direct start).
    # Not when the lease pass decides when it starts (concurrency slots,
    # throttle, priority order), the run waits for more events (debounce,
    # batch) or the worker learns its deadline there (timeouts, enforced by
    # its duties): those runs always go through a lease pass.
    starts_directly: ClassVar[bool] = True

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        return None

    def priority(self, adm: Admission) -> float:
        return 0.0

    def place(self, adm: Admission, placement: Placement) -> None:
        return None

    def opened(self, adm: Admission) -> None:
        return None

    def check_triggers(self, triggers: Sequence[Trigger]) -> None:
        """Raise ``ConfigError`` if the rule cannot serve these triggers."""
        return None


class Config(Protocol):
    """A public option class (``ss.Throttle``...): it resolves itself."""

    def resolve(self) -> Rule: ...


def check_type(value: Any, kind: type, field_name: str) -> None:
    if not isinstance(value, kind):
        raise ConfigError(field_name, f"expected ss.{kind.__name__}(...), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One flow-control keyword of ``@app.function`` whose value is one ``config``."""

    name: str
    config: type
    excludes: tuple[str, ...] = ()  # options that cannot be combined with this one

    def given(self, value: Any) -> bool:
        return value is not None

    def resolve(self, value: Any) -> Rule:
        check_type(value, self.config, self.name)
        config: Config = value
        return config.resolve()

    def load(self, raw: Any) -> Any:
        """The user's value back from the function's stored JSON description."""
        return self.config(**raw)


@dataclass(frozen=True, kw_only=True)
class ListOption(Option):
    """An option taking one config or a list of them, resolved together."""

    combine: Callable[[tuple[Any, ...]], Rule]
    most: int | None = None
    too_many: str = ""

    def given(self, value: Any) -> bool:
        return value is not None and value != [] and value != ()

    def resolve(self, value: Any) -> Rule:
        items = list(value) if isinstance(value, list | tuple) else [value]
        for item in items:
            check_type(item, self.config, self.name)
        if self.most is not None and len(items) > self.most:
            raise ConfigError(self.name, self.too_many)
        return self.combine(tuple(item.resolve(f"{self.name}[{i}]") for i, item in enumerate(items)))

    def load(self, raw: Any) -> Any:
        return [self.config(**item) for item in raw] if isinstance(raw, list) else self.config(**raw)
