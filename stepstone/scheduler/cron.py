"""Cron expressions with time zones: ``"TZ=Europe/Paris 0 9 * * *"``."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from stepstone.errors import ConfigError


def parse_cron(text: str, *, field: str) -> tuple[str, str]:
    """Split and validate; return ``(timezone, expression)``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(field, "expected a cron expression string")
    parts = text.split()
    timezone = "UTC"
    if parts[0].startswith(("TZ=", "CRON_TZ=")):
        timezone = parts[0].split("=", 1)[1]
        parts = parts[1:]
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(field, f"unknown time zone {timezone!r}") from exc
    expression = " ".join(parts)
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=ZoneInfo(timezone)))
    except (CronSimError, ValueError) as exc:
        raise ConfigError(field, f"invalid cron expression {expression!r}: {exc}") from exc
    return timezone, expression


def next_tick(expression: str, timezone: str, after: float) -> float:
    """The first tick strictly after ``after`` (epoch seconds)."""
    zone = ZoneInfo(timezone)
    start = datetime.fromtimestamp(after, zone)
    return next(CronSim(expression, start)).timestamp()


def latest_tick(expression: str, timezone: str, at_or_before: float) -> float | None:
    """The last tick at or before ``at_or_before`` within the past year, if any."""
    zone = ZoneInfo(timezone)
    end = datetime.fromtimestamp(at_or_before, zone)
    sim = CronSim(expression, end + timedelta(seconds=1), reverse=True)
    try:
        tick = next(sim)
    except StopIteration:
        return None
    if (end - tick).days > 366:
        return None
    return tick.timestamp()
