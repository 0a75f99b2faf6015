"""One cap for every HTTP body the endpoint, the pusher and the app sync read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from stepstone.bodies import BodyTooLarge, read_capped


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def test_a_body_up_to_the_cap_is_read_whole() -> None:
    assert asyncio.run(read_capped(_stream(b"ab", b"cd"), 4)) == b"abcd"
    assert asyncio.run(read_capped(_stream(), 4, declared=0)) == b""


def test_a_streamed_body_past_the_cap_stops_at_the_chunk_that_passes_it() -> None:
    read: list[bytes] = []

    async def counted() -> AsyncIterator[bytes]:
        for chunk in (b"ab", b"cde", b"never read"):
            read.append(chunk)
            yield chunk

    with pytest.raises(BodyTooLarge):
        asyncio.run(read_capped(counted(), 4))
    assert read == [b"ab", b"cde"]


def test_a_declared_length_past_the_cap_is_refused_before_reading() -> None:
    read: list[bytes] = []

    async def counted() -> AsyncIterator[bytes]:
        read.append(b"x")
        yield b"x"

    with pytest.raises(BodyTooLarge):
        asyncio.run(read_capped(counted(), 4, declared=5))
    assert read == []
