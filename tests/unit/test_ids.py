"""Run and event ids: 26 Crockford base-32 digits of a 128-bit value whose top
48 bits are the milliseconds, strictly increasing within a process."""

from __future__ import annotations

from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from stepstone import ids


def _digits(value: int) -> str:
    """The definition: 26 digits of 5 bits, most significant first."""
    return "".join(ids._ALPHABET[(value >> (5 * i)) & 31] for i in reversed(range(26)))


@given(st.integers(min_value=0, max_value=2**128 - 1))
def test_an_id_spells_its_value_in_26_crockford_digits(value: int) -> None:
    millis, low = value >> 80, value & (2**80 - 1)
    with (
        mock.patch.object(ids, "_last", -1),
        mock.patch("os.urandom", lambda n: low.to_bytes(n, "big")),
    ):
        assert ids.new_id(millis / 1000 + 0.0001) == _digits(value)


def test_ids_increase_within_a_millisecond_and_sort_by_time() -> None:
    made = [ids.new_id(1_700_000_000.0) for _ in range(100)]
    assert made == sorted(made) and len(set(made)) == 100
    assert all(len(i) == 26 for i in made)
    assert ids.new_id(1_800_000_000.0) > made[-1]
