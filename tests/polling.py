"""Waiting on a condition in tests: a poll with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` when the deadline passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
