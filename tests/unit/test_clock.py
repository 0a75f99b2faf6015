"""``DatabaseClock``: whatever the round trips and however the clocks drift
(within ``DRIFT``), the time it reads is within its stated uncertainty of the
server's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepstone.clock import DRIFT, DatabaseClock


class Local:
    """This machine's clock, moved by the test."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


# one measurement: (seconds since the previous one, delay to the server, delay back)
measurement = st.tuples(st.floats(0, 30), st.floats(0, 0.5), st.floats(0, 0.5))


@settings(max_examples=300, deadline=None)
@given(
    offset=st.floats(-1e6, 1e6),
    rate=st.floats(-DRIFT, DRIFT),
    measurements=st.lists(measurement, min_size=1, max_size=20),
    later=st.floats(0, 60),
)
def test_the_corrected_time_is_within_its_uncertainty_of_the_servers(
    offset: float, rate: float, measurements: list[tuple[float, float, float]], later: float
) -> None:
    local = Local(1000.0)
    clock = DatabaseClock(local)

    def server(at: float) -> float:  # the server's clock, drifting against ours by ``rate``
        return offset + at + rate * (at - 1000.0)

    def check() -> None:
        bound = clock.uncertainty()
        assert bound is not None
        assert abs(clock.now() - server(local.t)) <= bound + 1e-6

    for gap, there, back in measurements:
        local.t += gap
        sent = local.t
        read = server(sent + there)
        local.t += there + back
        clock.observe(read, sent, local.t)
        check()
    local.t += later
    check()


def test_a_local_clock_stepped_by_ntp_is_followed_at_the_next_measurement() -> None:
    local = Local(1000.0)
    clock = DatabaseClock(local)
    assert clock.observe(1060.0, 999.99, 1000.01)  # the server is a minute ahead
    assert abs(clock.offset - 60.0) < 1e-9
    local.t += 5.0  # a heartbeat later, NTP steps this clock forward by 50 s
    local.t += 50.0
    assert clock.observe(local.t + 10.0 + 0.01, local.t, local.t + 0.02)
    assert abs(clock.now() - (local.t + 10.0)) <= 0.01 + 1e-9


def test_a_slow_round_trip_does_not_replace_a_fresh_precise_measurement() -> None:
    local = Local(1000.0)
    clock = DatabaseClock(local)
    assert clock.observe(1100.0, 999.999, 1000.001)
    local.t += 1.0
    assert not clock.observe(1101.0 + 0.4, local.t - 0.5, local.t + 0.5)  # 1 s round trip, skewed
    assert abs(clock.offset - 100.0) < 1e-9
    assert not clock.observe(0.0, 10.0, 9.0)  # the local clock stepped back mid-measurement
