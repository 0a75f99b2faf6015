"""The SQLite store: WAL, durability options, migrations, commit budget, sharing."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

import stepstone as ss
from stepstone.store.postgres import PostgresStore
from stepstone.store.sqlite import SqliteStore

SCHEMA_SNAPSHOT = Path(__file__).parent.parent / "schema" / "sqlite.sql"


def dump_schema(path: str) -> str:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
    return "\n".join(f"-- {t} {n}\n{sql};\n" for t, n, sql in rows)


def test_migrations_produce_the_canonical_schema(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "m.db"))
    applied = store.migrate()
    assert applied and applied == sorted(applied)
    assert store.migrate() == []  # idempotent
    store.close()
    assert dump_schema(str(tmp_path / "m.db")) == SCHEMA_SNAPSHOT.read_text(), (
        "schema changed: update tests/schema/sqlite.sql if the migration is intended"
    )


def test_wal_and_durability_options(tmp_path: Path) -> None:
    default = SqliteStore.from_url(f"sqlite:///{tmp_path}/a.db")
    conn = default.connect()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    fast = SqliteStore.from_url(f"sqlite:///{tmp_path}/b.db?synchronous=normal&busy_timeout=2000")
    conn2 = fast.connect()
    assert conn2.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn2.execute("PRAGMA busy_timeout").fetchone()[0] == 2000
    for url, message in [
        (f"sqlite:///{tmp_path}/c.db?synchronous=sometimes", "synchronous"),
        (f"sqlite:///{tmp_path}/c.db?cache=big", "unknown SQLite option"),
        ("mysql://x", "unsupported URL"),
    ]:
        with pytest.raises(ss.ConfigError, match=message):
            ss.App("x", database_url=url).send(ss.Event("e"))
    conn.close()
    conn2.close()


@pytest.mark.parametrize("sender", ["another app", "the worker's app"])
def test_three_step_run_costs_five_commits(make_app: Callable[..., ss.App], sender: str) -> None:
    app = make_app()

    @app.function(id="f", trigger=ss.on_event("go"))
    async def f(ctx: ss.Context) -> int:
        for name in ("a", "b", "c"):
            await ctx.step.run(name, lambda: 1)
        return 3

    app.start()
    client = make_app("client") if sender == "another app" else app
    stores = {id(a.store): a.store for a in (app, client)}.values()
    assert all(isinstance(store, SqliteStore | PostgresStore) for store in stores)
    before = sum(store.commits for store in stores)  # type: ignore[attr-defined]
    [eid] = client.send(ss.Event("go"))
    run = app.runs.wait(app.runs.list(event_id=eid)[0].id)
    assert run.status == "completed"
    commits = sum(store.commits for store in stores) - before  # type: ignore[attr-defined]
    # event+run, lease, one per step (the last also finishes the run); a run
    # sent beside its worker starts in the send's commit (a direct start)
    assert commits == (5 if client is not app else 4)


def _send_from_process(url: str, prefix: str, n: int) -> None:
    app = ss.App("writer", database_url=url)
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    for i in range(n):
        app.send(ss.Event("go", id=f"{prefix}-{i}"))
    app.close()


def test_several_processes_share_one_file(make_app: Callable[..., ss.App], db_url: str) -> None:
    app = make_app()
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: None)
    app.send(ss.Event("go", id="parent"))  # migrate first
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_send_from_process, args=(db_url, f"p{i}", 50)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(app.runs.list(function_id="f", limit=1000)) == 151
