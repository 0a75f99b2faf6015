"""The send's per-function and per-value shortcuts (issue 18, session 9) give
what the general path gives: a plain run's queue spec made once per function,
``{}`` encoded without json's encoder, an event without data not walked for
its depth."""

from __future__ import annotations

import json

import pytest

from stepstone import serde
from stepstone.errors import SerializationError
from stepstone.events import Event, InvalidEventError, validate_event
from stepstone.flow.base import Placement
from stepstone.store.rows import QueueSpec


def test_a_plain_placements_spec_is_its_functions_partition_and_made_once() -> None:
    spec = Placement(due=1.0).queue_spec("fn")
    assert spec == QueueSpec(partition_key="fn", ckey1=None, limit1=None, ckey2=None, limit2=None)
    assert Placement(due=2.0, start_deadline=5.0).queue_spec("fn") is spec  # shared: frozen
    assert Placement(due=1.0).queue_spec("other").partition_key == "other"


def test_a_keyed_or_throttled_placement_still_gets_its_own_spec() -> None:
    keyed = Placement(due=1.0, slots=[("k", 2)]).queue_spec("fn")
    assert (keyed.partition_key, keyed.ckey1, keyed.limit1) == ("fn|k", "k", 2)
    throttled = Placement(due=1.0, throttle_key="t").queue_spec("fn")
    assert (throttled.partition_key, throttled.throttle_key) == ("fn", "t")


@pytest.mark.parametrize("value", [{}, {"a": 1}, [], 0, 7, "x", None, {"é": [1, {}]}])
def test_dumps_is_jsons_compact_encoding(value: object) -> None:
    assert serde.dumps(value, what="v") == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_dumps_still_refuses_what_json_cannot_encode() -> None:
    with pytest.raises(SerializationError):
        serde.dumps({"x": object()}, what="v")


def test_an_event_without_data_is_valid_and_deep_data_still_refused() -> None:
    validate_event(Event("e", {}))
    deep: dict[str, object] = {}
    for _ in range(100):
        deep = {"d": deep}
    with pytest.raises(InvalidEventError):
        validate_event(Event("e", deep), max_depth=64)
