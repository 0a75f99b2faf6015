"""Database size visible (issue 17): rows and bytes per table and the oldest
ended run, read from the database's own catalog on both stores."""

from __future__ import annotations

import stepstone as ss
from stepstone.inventory import database_stats

from ..conftest import query, send_and_wait


def test_stats_count_every_table_and_find_the_oldest_ended_run(app: ss.App, db_url: str) -> None:
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: "x" * 5000))
    app.function(id="idle", trigger=ss.on_event("idle"))(lambda ctx: None)
    empty = app.store.read_sync(database_stats)
    assert empty.oldest_ended is None
    app.start()
    first = send_and_wait(app, ss.Event("go"))
    send_and_wait(app, ss.Event("go"))
    app.send(ss.Event("idle"))  # queued, never ends: not the oldest ended run
    stats = app.store.read_sync(database_stats)
    tables = {t.name: t for t in stats.tables}
    expected = {name for (name,) in query(db_url, _TABLES[db_url.split(":")[0]])}
    assert set(tables) == expected and {"runs", "steps", "events", "spans"} <= expected
    for name in ("runs", "steps", "events"):
        [(count,)] = query(db_url, f"SELECT COUNT(*) FROM {name}")
        assert tables[name].rows == count
    assert tables["runs"].rows == 3 and tables["steps"].rows == 2
    grew = tables["steps"].bytes
    assert grew is not None and grew >= 10_000  # two 5 kB outputs
    assert stats.total_bytes >= sum(t.bytes or 0 for t in stats.tables) > 0
    assert stats.oldest_ended is not None and stats.oldest_ended.id == first.id


_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
    "postgresql": "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()",
}
