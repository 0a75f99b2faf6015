"""Invalid configuration fails at decoration time, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

import stepstone as ss


def decorate(**options: Any) -> None:
    app = ss.App("config-test", database_url="sqlite:///unused.db")
    options.setdefault("id", "f")
    app.function(**options)(lambda ctx: None)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"id": ""}, "id"),
        ({"id": "has space"}, "id"),
        ({"retries": -1}, "retries"),
        ({"retries": "4"}, "retries"),
        ({"backoff": ss.Backoff(initial="soon")}, "backoff.initial"),
        ({"backoff": ss.Backoff(factor=0.5)}, "backoff.factor"),
        ({"backoff": ss.Backoff(jitter=2)}, "backoff.jitter"),
        ({"backoff": ss.Backoff(initial="2h", max="1h")}, "backoff.max"),
        (
            {"trigger": ss.on_event("x")} | {"concurrency": [ss.Concurrency(limit=0)]},
            r"concurrency\[0\]\.limit",
        ),
        ({"concurrency": [ss.Concurrency(1), ss.Concurrency(1), ss.Concurrency(1)]}, "concurrency"),
        ({"concurrency": ss.Concurrency(limit=1, key="event.data.")}, r"concurrency\[0\]\.key"),
        ({"concurrency": ss.Concurrency(limit=1, scope="env")}, r"concurrency\[0\]\.key"),
        ({"throttle": ss.Throttle(limit=1, period="0s")}, "throttle.period"),
        ({"rate_limit": ss.RateLimit(limit=-2, period="1m")}, "rate_limit.limit"),
        ({"debounce": ss.Debounce(period="1m", timeout="10s")}, "debounce.timeout"),
        ({"priority": ss.Priority(run="event.data.")}, "priority.run"),
        ({"priority": ss.Priority(run="event.data.vip ? 1200 : 0")}, "priority.run.*outside"),
        ({"priority": ss.Priority(run="-601")}, "priority.run.*outside"),
        ({"batch": ss.Batch(max_size=0, timeout="1s")}, "batch.max_size"),
        ({"batch": ss.Batch(max_size=10, timeout="1s"), "cancel_on": ss.CancelOn(event="x")}, "cancel_on"),
        ({"singleton": ss.Singleton(mode="replace")}, "singleton.mode"),  # type: ignore[arg-type]
        ({"cancel_on": ss.CancelOn(event="x", if_="nope.x == 1")}, r"cancel_on\[0\]\.if_"),
        ({"timeouts": ss.Timeouts(start="forever")}, "timeouts.start"),
        ({"idempotency": "event.data."}, "idempotency"),
        ({"on_failure": "not callable"}, "on_failure"),
        ({"trigger": "user.created"}, "trigger"),
    ],
)
def test_invalid_config_names_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        decorate(**options)


def test_trigger_errors_name_the_field() -> None:
    with pytest.raises(ss.ConfigError, match="trigger.if_"):
        ss.on_event("user.created", if_="event.data.plan ==")
    with pytest.raises(ss.ConfigError, match="trigger.event"):
        ss.on_event("")
    with pytest.raises(ss.ConfigError, match="trigger.cron"):
        ss.on_cron("61 * * * *")
    with pytest.raises(ss.ConfigError, match="trigger.cron.*time zone"):
        ss.on_cron("TZ=Mars/Olympus 0 9 * * *")


def test_duplicate_function_id_is_rejected() -> None:
    app = ss.App("dup", database_url="sqlite:///unused.db")
    app.function(id="same")(lambda ctx: None)
    with pytest.raises(ss.ConfigError, match="id.*already registered"):
        app.function(id="same")(lambda ctx: None)


def test_valid_config_is_accepted() -> None:
    decorate(
        trigger=[
            ss.on_event("user.*", if_="event.data.plan != 'free'"),
            ss.on_cron("TZ=Europe/Paris 0 9 * * *"),
        ],
        retries=0,
        backoff=ss.Backoff(initial="1s", factor=3, max="1m", jitter=0),
        concurrency=[
            ss.Concurrency(limit=2, key="event.data.tenant"),
            ss.Concurrency(limit=5, key="event.data.region", scope="env"),
        ],
        throttle=ss.Throttle(limit=10, period="1m", burst=2),
        priority=ss.Priority(run="event.data.plan == 'enterprise' ? 120 : 0"),
        timeouts=ss.Timeouts(start="5m", finish="1h"),
    )
