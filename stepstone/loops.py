"""A background loop kept alive: ``forever`` runs one pass after another until
its owner stops. A pass failing because the database is (``StoreError``) is
logged and retried after a fixed pause; anything else is a bug, logged with its
traceback and retried after a pause that doubles while failures repeat. A
worker's lease, heartbeat and retention loops run this way: a loop that died
would leave the worker silently idle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from stepstone.errors import StoreError

log = logging.getLogger("stepstone.worker")

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 5.0  # seconds a loop pauses after unexpected failures


async def forever(
    owner: str,
    what: str,
    once: Callable[[], Awaitable[None]],
    store_pause: float,
    stopping: Callable[[], bool],
) -> None:
    """Run ``once`` until ``stopping()``; ``owner`` and ``what`` name it in the log."""
    failures = 0
    while not stopping():
        try:
            await once()
        except asyncio.CancelledError:
            raise
        except StoreError as exc:
            log.warning("worker %s: %s failed (%s); retrying", owner, what, exc)
            await asyncio.sleep(store_pause)
        except Exception:
            failures += 1
            pause = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1))
            log.exception("worker %s: %s failed unexpectedly; retrying in %.1fs", owner, what, pause)
            await asyncio.sleep(pause)
        else:
            failures = 0
