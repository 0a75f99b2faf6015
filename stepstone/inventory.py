"""What the database knows about functions, and how big it is, for operators
(HTTP API, CLI, dashboard).

Every app writes its functions' triggers and configuration to the store (see
``catalog.py``); this module reads them back as plain descriptions, without
rebuilding definitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stepstone.errors import ConfigError
from stepstone.store.base import FunctionsTx, Tx
from stepstone.store.rows import ENDED_STATUSES, RunRow, RunStatus
from stepstone.store.viewrows import TableSize

_SHAPE_KEYS = ("id", "triggers", "retries", "failure_of")


@dataclass(frozen=True)
class FunctionInfo:
    """A registered function: the app that registered it, its triggers
    (``{"event", "if"}`` or ``{"cron", "jitter"}``), retries and the rest of its
    configuration (flow control, back-off, timeouts) as JSON values."""

    id: str
    app: str
    triggers: list[dict[str, Any]]
    retries: int
    failure_of: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    retired_at: float | None = None  # set when its app's current deploy no longer has it


def _info(function_id: str, app: str, config_json: str, retired_at: float | None = None) -> FunctionInfo:
    raw = json.loads(config_json)
    return FunctionInfo(
        id=function_id,
        app=app,
        triggers=list(raw.get("triggers") or []),
        retries=int(raw.get("retries", 4)),
        failure_of=raw.get("failure_of"),
        config={k: v for k, v in raw.items() if k not in _SHAPE_KEYS},
        retired_at=retired_at,
    )


def list_functions(tx: FunctionsTx) -> list[FunctionInfo]:
    """Every function registered in the store, by id, retired ones included
    (their queued runs are still there to see and cancel)."""
    retired = tx.retired_functions()
    return [
        _info(fid, app, config, retired.get(fid))
        for fid, (app, config) in sorted(tx.load_functions().items())
    ]


def require_function(tx: FunctionsTx, function_id: str, field_name: str = "function_id") -> None:
    """Raise ``ConfigError`` naming ``field_name`` if no app registered ``function_id``."""
    if function_id not in tx.load_functions():
        raise ConfigError(field_name, f"unknown function {function_id!r}")


@dataclass(frozen=True, kw_only=True)
class EndedRun:
    """The run that ended first: how far back the database goes."""

    id: str
    function_id: str
    status: RunStatus
    ended_at: float

    @classmethod
    def of(cls, run: RunRow | None) -> EndedRun | None:
        if run is None or run.ended_at is None:
            return None
        return cls(id=run.id, function_id=run.function_id, status=run.status, ended_at=run.ended_at)


@dataclass(frozen=True, kw_only=True)
class DatabaseStats:
    """What the database holds, so that an operator sees growth before the disk
    does (``stepstone stats``, the dashboard's Database page, ``GET
    /api/v1/stats``, ``ss.Client.stats()``)."""

    tables: list[TableSize]
    total_bytes: int
    oldest_ended: EndedRun | None


def database_stats(tx: Tx) -> DatabaseStats:
    return DatabaseStats(
        tables=tx.table_sizes(),
        total_bytes=tx.database_bytes(),
        oldest_ended=EndedRun.of(tx.oldest_ended_run(ENDED_STATUSES)),
    )


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` (not measurable) -> ``"?"``."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
