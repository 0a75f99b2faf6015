"""Rewrite the schema snapshots after an intended migration:

    .venv/bin/python tests/schema/regenerate.py

The PostgreSQL snapshot needs the server binaries (a private cluster is
started and removed); without them only the SQLite one is rewritten.
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # the repository: tests is a package

from stepstone.store.postgres import PostgresStore
from stepstone.store.sqlite import SqliteStore
from tests.integration.test_postgres import SCHEMA_SNAPSHOT as PG_SNAPSHOT
from tests.integration.test_postgres import dump_schema as dump_pg_schema
from tests.integration.test_storage import SCHEMA_SNAPSHOT, dump_schema
from tests.pgcluster import PgCluster, PgUnavailable


def sqlite_snapshot() -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(f"{folder}/schema.db")
        store.migrate()
        store.close()
        SCHEMA_SNAPSHOT.write_text(dump_schema(f"{folder}/schema.db"))
    print(f"wrote {SCHEMA_SNAPSHOT}")


def postgres_snapshot() -> None:
    try:
        cluster = PgCluster.start_new()
    except PgUnavailable as exc:
        print(f"PostgreSQL snapshot not rewritten: {exc}")
        return
    try:
        url = cluster.create_database("schema")
        store = PostgresStore.from_url(url)
        store.migrate()
        store.close()
        PG_SNAPSHOT.write_text(dump_pg_schema(url))
    finally:
        cluster.stop()
    print(f"wrote {PG_SNAPSHOT}")


sqlite_snapshot()
postgres_snapshot()
