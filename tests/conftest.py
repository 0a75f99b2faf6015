"""Shared fixtures: a fresh SQLite file per test, apps with in-process workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss

FAST = ss.Backoff(initial="5ms", factor=1, max="5ms", jitter=0)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/stepstone.db"


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., ss.App]]:
    apps: list[ss.App] = []

    def make(name: str = "test", **kwargs: Any) -> ss.App:
        kwargs.setdefault("database_url", db_url)
        app = ss.App(name, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def app(make_app: Callable[..., ss.App]) -> ss.App:
    return make_app()


def run_of(app: ss.App, event_id: str, function_id: str | None = None) -> ss.Run:
    runs = app.runs.list(event_id=event_id, function_id=function_id)
    assert len(runs) == 1, runs
    return runs[0]


def send_and_wait(app: ss.App, event: ss.Event, timeout: str = "10s") -> ss.Run:
    [event_id] = app.send(event)
    return app.runs.wait(run_of(app, event_id).id, timeout=timeout)
