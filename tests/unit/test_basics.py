"""Durations, expressions, ids."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stepstone.durations import parse_duration
from stepstone.errors import ConfigError
from stepstone.expressions import compile_expression, equality_shape
from stepstone.ids import new_id


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("2h", 7200),
        ("7d", 604800),
        ("1h30m", 5400),
        (timedelta(minutes=2), 120),
        (1.5, 1.5),
        (0, 0),
    ],
)
def test_durations_parse(text: object, seconds: float) -> None:
    assert parse_duration(text, field="f") == pytest.approx(seconds)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "5", "ten seconds", "5x", "-5s", -1, True, None, "5s junk"])
def test_bad_durations_name_the_field(bad: object) -> None:
    with pytest.raises(ConfigError, match="backoff.initial"):
        parse_duration(bad, field="backoff.initial")  # type: ignore[arg-type]


def test_expression_semantics() -> None:
    cond = compile_expression("event.data.plan != 'free'", field="if_")
    assert cond.test({"event": {"data": {"plan": "pro"}}})
    assert not cond.test({"event": {"data": {"plan": "free"}}})
    assert not cond.test({"event": {"data": {}}})  # missing field: false, not an error
    key = compile_expression("event.data.tenant", field="key")
    assert key.key({"event": {"data": {"tenant": "a"}}}) == "a"
    assert key.key({"event": {"data": {}}}) is None


def test_expression_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"concurrency\[0\]\.key.*invalid CEL"):
        compile_expression("event.data.", field="concurrency[0].key")
    with pytest.raises(ConfigError, match="unknown variable.*user"):
        compile_expression("user.id == 1", field="if_")
    with pytest.raises(ConfigError, match="if_"):
        compile_expression("", field="if_")


def test_equality_shape() -> None:
    assert equality_shape("async.data.user_id == event.data.id") == ("user_id", "id")
    assert equality_shape("event.data.id == async.data.user.id") == ("user.id", "id")
    assert equality_shape("async.data.a == async.data.b") is None
    assert equality_shape("async.data.a == event.data.b && true") is None


def test_index_values_give_cel_equal_values_one_text() -> None:
    from stepstone.runtime.waits import index_value

    assert index_value(1) == index_value(1.0) == "1"
    assert index_value({"b": [2.0], "a": -0.0}) == index_value({"a": 0, "b": [2]}) == '{"a":0,"b":[2]}'
    assert index_value(2**53 + 1) == index_value(float(2**53))  # CEL compares them as doubles
    assert index_value(True) != index_value(1) and index_value(None) == "null"
    assert index_value(1.5) == "1.5" and index_value("1") == '"1"'


def test_ids_sort_by_time_and_are_unique() -> None:
    ids = [new_id(1000.0 + i) for i in range(50)]
    assert ids == sorted(ids)
    assert len({new_id(5.0) for _ in range(1000)}) == 1000
    assert all(len(i) == 26 for i in ids)


def test_every_public_name_is_documented_in_the_readme() -> None:
    """The curated surface (``stepstone.__all__``) is the contract: each name is
    in the README, as ``ss.Name`` or in backquotes."""
    import re
    from pathlib import Path

    import stepstone

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    undocumented = [
        name for name in stepstone.__all__ if not re.search(r"(ss\.|`)" + re.escape(name) + r"\b", readme)
    ]
    assert undocumented == []
