"""The SQL layer's plumbing: named statements from ``queries.sql``, the small
``Dialect`` that adapts them to a database, and ``SqlPlumbing``, which runs
them on a DB-API connection already inside a transaction."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, TypeVar

T = TypeVar("T")

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.M)
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_INCLUDE = re.compile(r"\{query:(\w+)\}")  # another statement's text, as a subquery


@cache
def _raw_queries() -> dict[str, str]:
    text = resources.files("stepstone.store").joinpath("queries.sql").read_text()
    parts = _NAME.split(text)
    return {parts[i]: parts[i + 1].strip().rstrip(";") for i in range(1, len(parts), 2)}


def _included(name: str) -> str:
    """A statement's text with the statements it includes (and theirs) in place."""
    return _INCLUDE.sub(lambda m: _included(m.group(1)), _raw_queries()[name])


@dataclass(frozen=True)
class Dialect:
    """What differs between databases, kept small."""

    name: str
    lock: str = ""  # {lock}: lock the rows read, skipping rows another transaction holds
    lock_wait: str = ""  # {lock_wait}: lock the rows read, waiting for their holders
    pyformat: bool = False
    key_lock: str | None = None  # SQL taking a transaction-scoped lock on :key (None: writers are serial)
    key_try_lock: str | None = None  # the same without waiting; returns one row, column "ok"
    server_clock: str | None = None  # SQL reading the server's clock (epoch seconds, column "now")
    fence_raises: bool = False  # fence checks fail on the server (no need to read them back)
    write_ctes: bool = False  # data-modifying CTEs (WITH ... DELETE): a held run's end in one statement
    pipelined: bool = False  # statements sent before an earlier one's result is read share its round trip
    statement_timeout: bool = False  # a transaction-local statement_timeout bounds user SQL (usertx.py)
    output_bytes: str = "octet_length(output)"  # {output_bytes}: a step output's stored size in bytes
    _cache: dict[str | tuple[str, tuple[tuple[str, int], ...]], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    def sql(self, name: str, lists: Mapping[str, int] = {}) -> str:
        key = (name, tuple(sorted(lists.items()))) if lists else name
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        text = _included(name)
        expansions = {k: ", ".join(f":{k}_{i}" for i in range(n)) or "NULL" for k, n in lists.items()}
        text = text.replace("{lock}", self.lock).replace("{lock_wait}", self.lock_wait)
        text = text.replace("{output_bytes}", self.output_bytes)
        for k, v in expansions.items():
            text = text.replace("{" + k + "}", v)
        if self.pyformat:
            text = _PARAM.sub(r"%(\1)s", text.replace("%", "%%"))
        self._cache[key] = text
        return text


def once(read: Callable[[], T]) -> Callable[[], T]:
    """``read`` called at most once, its value kept: a result read after the
    ``COMMIT`` by whoever asks first (``functools.cache`` costs ~25 calls to
    make, and one is made per statement sent this way)."""
    kept: list[T] = []

    def value() -> T:
        if not kept:
            kept.append(read())
        return kept[0]

    return value


class SqlPlumbing:
    """A transaction's connection and dialect, and the three ways to run a statement."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    # -- plumbing ---------------------------------------------------------------
    def _exec(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        lists: Mapping[str, Sequence[Any]] | None = None,
    ) -> Any:
        if not lists:  # the common case, and every step checkpoint's: no copy
            return self.conn.execute(self.dialect.sql(name), params or {})
        args = dict(params or {})
        sizes: dict[str, int] = {}
        for key, values in (lists or {}).items():
            sizes[key] = len(values)
            for i, value in enumerate(values):
                args[f"{key}_{i}"] = value
        return self.conn.execute(self.dialect.sql(name, sizes), args)

    def _all(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        lists: Mapping[str, Sequence[Any]] | None = None,
    ) -> list[Any]:
        return list(self._exec(name, params, lists).fetchall())

    def _one(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._exec(name, params).fetchone()
