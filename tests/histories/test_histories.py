"""Histories of real runs, exported with ``stepstone runs export``, replayed
against the code in shop.py: the README's example, as a plain pytest test."""

from __future__ import annotations

import json
from pathlib import Path

from .shop import app

HISTORIES = sorted(Path(__file__).parent.glob("*.json"))


def test_exported_histories_still_fit_the_code() -> None:
    report = app.check(histories=[json.loads(path.read_text()) for path in HISTORIES])
    assert report.ok, report.incompatible
    assert report.runs_checked == len(HISTORIES) > 0
