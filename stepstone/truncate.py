"""Bounding text that is stored but not chosen by a limit-checked API.

Step outputs and events are refused when over their limits; an error's message
or traceback cannot be refused (the failure must be recorded), so it is cut
instead. The cut text keeps its beginning and ends with a marker naming the
original size, and is itself within the bound, marker included: cutting again
changes nothing.
"""

from __future__ import annotations


def clip(text: str, limit: int) -> str:
    """``text`` if its UTF-8 encoding fits in ``limit`` bytes, else its longest
    prefix that fits together with a marker saying how long it was."""
    if len(text) <= limit // 4:  # even at 4 bytes a character it fits
        return text
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    marker = f"\n... [truncated: {len(encoded)} bytes in all]"
    kept = encoded[: max(0, limit - len(marker.encode()))]
    return kept.decode("utf-8", "ignore") + marker
