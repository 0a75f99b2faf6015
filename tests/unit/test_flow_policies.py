"""Each flow-control option resolves to a named, frozen record or fails naming
the field; the registry of options (``stepstone.flow.POLICIES``) is the one
list decoration, the catalog and admission iterate. No store: milliseconds."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import timedelta
from typing import Any

import pytest

import stepstone as ss
from stepstone.app import _jsonable
from stepstone.flow import POLICIES, FlowConfig, build_flow, load_settings
from stepstone.flow.batch import ResolvedBatch
from stepstone.flow.cancel_on import CancelOnRule
from stepstone.flow.concurrency import ConcurrencyRule
from stepstone.flow.debounce import ResolvedDebounce
from stepstone.flow.idempotency import Idempotency, ResolvedIdempotency
from stepstone.flow.priority import ResolvedPriority
from stepstone.flow.rate_limit import ResolvedRateLimit
from stepstone.flow.singleton import ResolvedSingleton
from stepstone.flow.throttle import ResolvedThrottle
from stepstone.flow.timeouts import ResolvedTimeouts

EVENT = {"event": {"name": "e", "data": {"tenant": "t1", "vip": True, "n": 7}, "id": "1", "ts": 0}}


def test_concurrency_resolves_each_limit() -> None:
    limit = ss.Concurrency(limit=3, key="event.data.tenant", scope="env").resolve("concurrency[1]")
    assert (limit.limit, limit.scope) == (3, "env")
    assert limit.key is not None and limit.key.key(EVENT) == "t1"
    assert ss.Concurrency(limit=1).resolve().key is None


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ss.Concurrency(limit=0), r"concurrency\[1\]\.limit"),
        (ss.Concurrency(limit=True), r"concurrency\[1\]\.limit"),
        (ss.Concurrency(limit=1, scope="world"), r"concurrency\[1\]\.scope"),  # type: ignore[arg-type]
        (ss.Concurrency(limit=1, scope="env"), r"concurrency\[1\]\.key"),
        (ss.Concurrency(limit=1, key="event.data."), r"concurrency\[1\]\.key"),
    ],
)
def test_concurrency_rejects(config: ss.Concurrency, field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        config.resolve("concurrency[1]")


def test_throttle_resolves_seconds_and_key() -> None:
    rule = ss.Throttle(limit=10, period=timedelta(minutes=1), burst=2, key="event.data.n").resolve()
    assert isinstance(rule, ResolvedThrottle)
    assert (rule.limit, rule.burst, rule.period) == (10, 2, 60.0)
    assert rule.key is not None and rule.key.key(EVENT) == 7


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ss.Throttle(limit=0, period="1m"), "throttle.limit"),
        (ss.Throttle(limit=1, period="1m", burst=0), "throttle.burst"),
        (ss.Throttle(limit=1, period="0s"), "throttle.period"),
        (ss.Throttle(limit=1, period="soon"), "throttle.period"),
        (ss.Throttle(limit=1, period="1m", key="("), "throttle.key"),
    ],
)
def test_throttle_rejects(config: ss.Throttle, field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        config.resolve()


def test_rate_limit_resolves() -> None:
    rule = ss.RateLimit(limit=2, period="1h").resolve()
    assert (rule.limit, rule.period, rule.key) == (2, 3600.0, None)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ss.RateLimit(limit=-2, period="1m"), "rate_limit.limit"),
        (ss.RateLimit(limit=1, period=-1), "rate_limit.period"),
        (ss.RateLimit(limit=1, period="1m", key="event.data."), "rate_limit.key"),
    ],
)
def test_rate_limit_rejects(config: ss.RateLimit, field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        config.resolve()


def test_debounce_resolves_period_and_timeout() -> None:
    rule = ss.Debounce(period="10s", timeout="1m", key="event.data.tenant").resolve()
    assert (rule.period, rule.timeout) == (10.0, 60.0)
    assert ss.Debounce(period=5).resolve().timeout is None


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ss.Debounce(period="0s"), "debounce.period"),
        (ss.Debounce(period="1m", timeout="10s"), "debounce.timeout.*shorter"),
        (ss.Debounce(period="1m", timeout="never"), "debounce.timeout"),
        (ss.Debounce(period="1m", key=""), "debounce.key"),
    ],
)
def test_debounce_rejects(config: ss.Debounce, field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        config.resolve()


class _Variables:
    """What ``ResolvedPriority.priority`` reads of an admission."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.variables = {"event": {"name": "e", "data": data, "id": "1", "ts": 0}}


@pytest.mark.parametrize(
    ("data", "seconds"),
    [
        ({"p": 120}, 120.0),
        ({"p": 9999}, 600.0),
        ({"p": -9999}, -600.0),
        ({"p": "high"}, 0.0),
        ({"p": True}, 0.0),
    ],
)
def test_priority_is_clamped_seconds(data: dict[str, Any], seconds: float) -> None:
    rule = ss.Priority(run="event.data.p").resolve()
    assert rule.priority(_Variables(data)) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("run", "match"),
    [
        ("event.data.", "priority.run"),
        ("event.data.vip ? 601 : 0", "priority.run.*601.*outside"),
        ("", "priority.run"),
    ],
)
def test_priority_rejects(run: str, match: str) -> None:
    with pytest.raises(ss.ConfigError, match=match):
        ss.Priority(run=run).resolve()


def test_priority_ignores_numbers_inside_strings() -> None:
    assert isinstance(ss.Priority(run="event.data.plan == '9000' ? 60 : 0").resolve(), ResolvedPriority)


def test_batch_resolves() -> None:
    rule = ss.Batch(max_size=100, timeout="5s", key="event.data.tenant").resolve()
    assert (rule.max_size, rule.timeout) == (100, 5.0)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ss.Batch(max_size=0, timeout="1s"), "batch.max_size"),
        (ss.Batch(max_size=1001, timeout="1s"), "batch.max_size.*1000"),
        (ss.Batch(max_size=2, timeout="0s"), "batch.timeout"),
        (ss.Batch(max_size=2, timeout="1s", key="nope."), "batch.key"),
    ],
)
def test_batch_rejects(config: ss.Batch, field: str) -> None:
    with pytest.raises(ss.ConfigError, match=field):
        config.resolve()


def test_batch_refuses_a_cron_trigger() -> None:
    rule = ss.Batch(max_size=2, timeout="1s").resolve()
    rule.check_triggers([ss.on_event("x")])
    with pytest.raises(ss.ConfigError, match="batch.*cron"):
        rule.check_triggers([ss.on_event("x"), ss.on_cron("0 9 * * *")])


def test_idempotency_resolves_and_rejects() -> None:
    rule = Idempotency("event.data.tenant").resolve()
    assert rule.key.key(EVENT) == "t1"
    for bad in ("", "event.data.", 42):
        with pytest.raises(ss.ConfigError, match="idempotency"):
            Idempotency(bad).resolve()  # type: ignore[arg-type]


def test_singleton_resolves_and_rejects() -> None:
    rule = ss.Singleton(key="event.data.tenant", mode="cancel").resolve()
    assert rule.mode == "cancel" and rule.key is not None
    assert ss.Singleton().resolve() == ResolvedSingleton(key=None, mode="skip")
    with pytest.raises(ss.ConfigError, match="singleton.mode"):
        ss.Singleton(mode="replace").resolve()  # type: ignore[arg-type]
    with pytest.raises(ss.ConfigError, match="singleton.key"):
        ss.Singleton(key="event.").resolve()


def test_cancel_on_resolves_each_entry() -> None:
    entry = ss.CancelOn(event="user.deleted", if_="async.data.id == event.data.id", timeout="7d").resolve(
        "cancel_on[2]"
    )
    assert (entry.field, entry.event, entry.timeout) == ("cancel_on[2]", "user.deleted", 7 * 86400.0)
    for config, field in (
        (ss.CancelOn(event=" "), r"cancel_on\[2\]\.event"),
        (ss.CancelOn(event="x", if_="nope.x == 1"), r"cancel_on\[2\]\.if_"),
        (ss.CancelOn(event="x", timeout="later"), r"cancel_on\[2\]\.timeout"),
    ):
        with pytest.raises(ss.ConfigError, match=field):
            config.resolve("cancel_on[2]")


def test_timeouts_resolve_and_reject() -> None:
    assert ss.Timeouts(start="5m").resolve() == ResolvedTimeouts(start=300.0, finish=None)
    with pytest.raises(ss.ConfigError, match="timeouts.start"):
        ss.Timeouts(start="forever").resolve()
    with pytest.raises(ss.ConfigError, match="timeouts.finish"):
        ss.Timeouts(finish=0).resolve()


def test_resolved_records_are_frozen_and_keyword_only() -> None:
    rule = ss.Throttle(limit=1, period="1s").resolve()
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.limit = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        ResolvedThrottle(1, 1, 1.0, None)  # type: ignore[call-arg]


# -- the registry -------------------------------------------------------------------


def test_every_policy_is_a_keyword_of_app_function_in_one_list() -> None:
    names = [option.name for option in POLICIES]
    assert len(names) == len(set(names))
    parameters = inspect.signature(ss.App.function).parameters
    assert set(names) <= set(parameters)


ALL_OPTIONS: dict[str, Any] = {
    "concurrency": [ss.Concurrency(limit=2, key="event.data.tenant"), ss.Concurrency(limit=5)],
    "throttle": ss.Throttle(limit=10, period=timedelta(minutes=1), burst=2),
    "rate_limit": ss.RateLimit(limit=1, period="1h", key="event.data.tenant"),
    "debounce": ss.Debounce(period="10s", timeout="1m"),
    "priority": ss.Priority(run="event.data.vip ? 120 : 0"),
    "idempotency": "event.data.n",
    "cancel_on": ss.CancelOn(event="user.deleted", timeout="7d"),
    "timeouts": ss.Timeouts(start="5m", finish="1h"),
}


def test_build_flow_gives_one_rule_per_option_in_policy_order() -> None:
    flow = build_flow(ALL_OPTIONS)
    kinds = [type(rule) for rule in flow.rules]
    assert kinds == [
        ConcurrencyRule,
        ResolvedThrottle,
        ResolvedPriority,
        ResolvedIdempotency,
        ResolvedRateLimit,
        ResolvedDebounce,
        CancelOnRule,
        ResolvedTimeouts,
    ]
    concurrency = flow.get(ConcurrencyRule)
    assert concurrency is not None and [c.limit for c in concurrency.limits] == [2, 5]
    assert flow.get(ResolvedBatch) is None
    assert build_flow({}) == FlowConfig() and build_flow({"concurrency": [], "cancel_on": ()}).rules == ()


def test_a_stored_description_rebuilds_the_same_rules() -> None:
    """What the catalog does for a function of another process: JSON and back."""
    described = {name: _jsonable(value) for name, value in ALL_OPTIONS.items()}
    assert build_flow(load_settings(described)) == build_flow(ALL_OPTIONS)
    assert load_settings({"id": "f", "retries": 3}) == {}


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"concurrency": [ss.Concurrency(1)] * 3}, "concurrency", "at most two"),
        ({"concurrency": [ss.Concurrency(1), "x"]}, "concurrency", r"expected ss\.Concurrency"),
        ({"throttle": {"limit": 1}}, "throttle", r"expected ss\.Throttle"),
        (
            {"batch": ss.Batch(2, "1s"), "rate_limit": ss.RateLimit(1, "1s")},
            "rate_limit",
            "combined with batch",
        ),
        ({"batch": ss.Batch(2, "1s"), "idempotency": "event.id"}, "idempotency", "combined with batch"),
        ({"batch": ss.Batch(2, "1s"), "cancel_on": [ss.CancelOn("x")]}, "cancel_on", "combined with batch"),
        ({"debounce": ss.Debounce("1s"), "singleton": ss.Singleton()}, "singleton", "combined with debounce"),
    ],
)
def test_build_flow_rejects(options: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ss.ConfigError, match=message) as raised:
        build_flow(options)
    assert raised.value.field == field
