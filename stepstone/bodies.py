"""HTTP bodies read no further than a cap, whether or not they declare their
length: the endpoint's requests, the pusher's answers, an app document."""

from __future__ import annotations

from collections.abc import AsyncIterable


class BodyTooLarge(Exception):
    """The body passed the cap (its declared length, or the bytes read so far)."""


async def read_capped(chunks: AsyncIterable[bytes], cap: int, declared: int | None = None) -> bytes:
    """The body of ``chunks``; ``BodyTooLarge`` as soon as it is known to pass ``cap``."""
    if declared is not None and declared > cap:
        raise BodyTooLarge
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge
        parts.append(chunk)
    return b"".join(parts)
