"""The filter form shared by the runs page and the bulk page: function, status,
app version, time range (a preset or explicit bounds), text search and a CEL condition.
Invalid input becomes a message on the page, never an error page."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from fastapi import Request

from stepstone.errors import ConfigError, ExpressionError
from stepstone.expressions import Expression, compile_expression
from stepstone.server.params import check_range, decode_cursor, parse_moment
from stepstone.store.rows import RUN_STATUSES

RANGES = (
    ("15m", "Last 15 minutes", 900.0),
    ("1h", "Last hour", 3600.0),
    ("24h", "Last 24 hours", 86400.0),
    ("7d", "Last 7 days", 7 * 86400.0),
    ("30d", "Last 30 days", 30 * 86400.0),
    ("all", "All time", 0.0),
)
_SECONDS = {key: value for key, _label, value in RANGES}


@dataclass
class RunQuery:
    function_id: str = ""
    status: str = ""
    app_version: str = ""
    range: str = "24h"
    since_text: str = ""
    until_text: str = ""
    q: str = ""
    if_text: str = ""
    cursor: str = ""
    since: float | None = None
    until: float | None = None
    condition: Expression | None = None
    before: str | None = None
    errors: list[str] = field(default_factory=list)

    def params(self, **changes: str) -> str:
        """The query string of this filter (``changes`` override fields; empty drops)."""
        values = {
            "function_id": self.function_id,
            "status": self.status,
            "app_version": self.app_version,
            "range": self.range,
            "since": self.since_text,
            "until": self.until_text,
            "q": self.q,
            "if": self.if_text,
        }
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v})

    @property
    def window(self) -> float | None:
        """Seconds covered by a preset range (None: all time or explicit bounds)."""
        if self.since_text or self.until_text:
            return None
        return _SECONDS.get(self.range) or None


def _field(request: Request, name: str) -> str:
    return request.query_params.get(name, "").strip()


def parse(request: Request, now: float, known_functions: set[str]) -> RunQuery:
    query = RunQuery(
        function_id=_field(request, "function_id"),
        status=_field(request, "status"),
        app_version=_field(request, "app_version"),
        range=_field(request, "range") or "24h",
        since_text=_field(request, "since"),
        until_text=_field(request, "until"),
        q=_field(request, "q"),
        if_text=_field(request, "if"),
        cursor=_field(request, "cursor"),
    )
    if query.function_id and query.function_id not in known_functions:
        query.errors.append(f"Unknown function {query.function_id!r}.")
        query.function_id = ""
    if query.status and query.status not in RUN_STATUSES:
        query.errors.append(f"Unknown status {query.status!r}.")
        query.status = ""
    if query.range not in _SECONDS:
        query.range = "24h"
    _bounds(query, now)
    _condition_and_cursor(query)
    return query


def _bounds(query: RunQuery, now: float) -> None:
    try:
        query.since = parse_moment(query.since_text or None, "since")
        query.until = parse_moment(query.until_text or None, "until")
        check_range(query.since, query.until)
    except ConfigError as exc:
        query.errors.append(f"Time range: {exc}")
        query.since = query.until = None
        query.since_text = query.until_text = ""
    if query.window is not None:
        query.since = now - query.window


def _condition_and_cursor(query: RunQuery) -> None:
    if query.if_text:
        try:
            query.condition = compile_expression(query.if_text, field="if")
        except (ConfigError, ExpressionError) as exc:
            query.errors.append(f"Condition: {exc}")
    if query.cursor:
        try:
            query.before = decode_cursor(query.cursor)
        except ConfigError:
            query.errors.append("That page link is no longer valid; showing the newest runs.")
