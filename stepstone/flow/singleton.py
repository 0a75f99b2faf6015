"""``singleton=``: one active run per key; ``skip`` records a new run skipped,
``cancel`` cancels the active one and admits the new.

The claim is a row in ``dedupe`` held until the run ends (lifecycle releases
it); every way a run becomes active (a new run, a replay, a re-run) claims
through :func:`claim_singleton`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepstone.errors import ConfigError
from stepstone.expressions import Expression
from stepstone.flow.base import Admission, Option, Placement, Rule, Skipped, Verdict
from stepstone.flow.checks import key_expression
from stepstone.store.base import Tx
from stepstone.store.rows import ENDED_STATUSES

FOREVER = 100 * 365 * 86400.0  # a claim held until released

Mode = Literal["skip", "cancel"]


@dataclass(frozen=True)
class Singleton:
    """One active run per key: ``skip`` drops new runs, ``cancel`` replaces the old."""

    key: str | None = None
    mode: Mode = "skip"

    def resolve(self) -> ResolvedSingleton:
        if self.mode not in ("skip", "cancel"):
            raise ConfigError("singleton.mode", f"must be 'skip' or 'cancel', got {self.mode!r}")
        return ResolvedSingleton(key=key_expression(self.key, "singleton.key"), mode=self.mode)


@dataclass(frozen=True, kw_only=True)
class ResolvedSingleton(Rule):
    key: Expression | None
    mode: Mode

    def admit(self, adm: Admission, placement: Placement) -> Verdict | None:
        key = f"singleton:{adm.function_id}:{adm.key(self.key)}"
        holder = claim_singleton(adm.tx, key, adm.run_id, adm.now)
        if holder is not None and self.mode == "skip":
            return Skipped(reason=f"singleton: run {holder} is active for this key")
        if holder is not None:
            adm.cancel(holder, f"replaced by run {adm.run_id} (singleton)")
            adm.tx.release_key(key, holder)
            adm.tx.claim_key(key, adm.run_id, adm.now + FOREVER, adm.now)
        placement.singleton_key = key  # the run holds the key until it ends
        return None


def claim_singleton(tx: Tx, key: str, run_id: str, now: float) -> str | None:
    """Claim a singleton ``key`` for ``run_id`` (a new run, or a replayed or re-run
    one: every way a run becomes active goes through here). Returns the other
    active run that holds the key, claiming nothing; a claim left by an ended
    run is taken over."""
    holder = tx.claim_key(key, run_id, now + FOREVER, now)
    if not holder or holder == run_id:
        return None
    current = tx.get_run(holder)
    if current is not None and current.status not in ENDED_STATUSES:
        return holder
    tx.release_key(key, holder)
    tx.claim_key(key, run_id, now + FOREVER, now)
    return None


OPTION = Option(name="singleton", config=Singleton)
