"""Shared fixtures: a fresh database per test on every backend, apps with
in-process workers.

``db_url`` is parametrized over SQLite (a file per test) and PostgreSQL (a
database cloned from a migrated template, on a private cluster started once per
session), so every test using ``db_url``, ``make_app`` or ``app`` runs on both.
Pin one backend with ``@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)``.
Without PostgreSQL the postgres cases are skipped, unless ``CI`` is set: then
they fail.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import stepstone as ss
from stepstone.store.base import Store

if TYPE_CHECKING:
    from tests.pgcluster import PgCluster

FAST = ss.Backoff(initial="5ms", factor=1, max="5ms", jitter=0)
BACKENDS = ("sqlite", "postgres")
MEMORY = "memory"  # the in-memory fake store of the unit tier (tests/fakes/memory.py)
TEMPLATE = "stepstone_template"
_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster for the session, with a migrated template database."""
    from tests.pgcluster import pg_missing, running_cluster

    try:
        from stepstone.store.postgres import PostgresStore
    except ImportError as exc:  # the postgres extra is not installed
        pg_missing(str(exc))
    with running_cluster() as cluster:
        store = PostgresStore.from_url(cluster.create_database(TEMPLATE))
        store.migrate()
        store.close()
        yield cluster


@pytest.fixture
def empty_url(pg_cluster: PgCluster) -> str:
    """A database with no schema at all."""
    return pg_cluster.create_database(f"empty_{time.monotonic_ns()}")


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database (a clone of the template), dropped after the test."""
    name = f"t_{next(_databases)}"
    yield pg_cluster.create_database(name, template=TEMPLATE)
    pg_cluster.drop_database(name)


def backend_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """The URL of a fresh database of ``backend`` ('memory': the unit tier's fake)."""
    if backend == MEMORY:
        return MEMORY
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/stepstone.db"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, request.param, tmp_path)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A migrated store on ``db_url`` (both backends), for tests that drive
    store operations directly; the in-memory fake where a module adds the
    ``memory`` backend to ``db_url`` (the store contract)."""
    from stepstone.store import make_store
    from tests.fakes.memory import MemoryStore

    if db_url == MEMORY:
        yield MemoryStore()
        return
    opened = make_store(db_url)
    opened.migrate()
    yield opened
    opened.close()


@pytest.fixture
def one_writer(db_url: str) -> Iterator[Store]:
    """``store`` with one writer on PostgreSQL, so that a test decides what one
    group commit holds (``tests/batches.py``)."""
    from stepstone.store import make_store

    opened = make_store(db_url if db_url.startswith("sqlite:") else f"{db_url}?writers=1")
    opened.migrate()
    yield opened
    opened.close()


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


def add_effect_once(*apps: ss.App) -> list[str]:
    """On each app, the function ``once`` (event ``once``): one step,
    ``effect``, that records its run's id and returns ``"done"``. The list it
    records into is returned: a run's id in it twice is a step run twice."""
    executed: list[str] = []
    for app in apps:

        @app.function(id="once", trigger=ss.on_event("once"))
        async def once(ctx: ss.Context) -> str:
            await ctx.step.run("effect", lambda: executed.append(ctx.run_id))
            return "done"

    return executed


def send_and_wait(app: ss.App, event: ss.Event, timeout: str = "10s") -> ss.Run:
    [event_id] = app.send(event)
    return app.runs.wait(run_of(app, event_id).id, timeout=timeout)


def query(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a read-only SQL statement, straight from either database."""
    if db_url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    import psycopg

    with psycopg.connect(db_url) as pg:
        return [tuple(r) for r in pg.execute(sql.encode()).fetchall()]


def table_rows(db_url: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of ``table`` as stored."""
    return query(db_url, f"SELECT * FROM {table}")
