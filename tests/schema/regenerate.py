"""Rewrite the schema snapshots after an intended migration:

    .venv/bin/python tests/schema/regenerate.py
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from integration.test_storage import SCHEMA_SNAPSHOT, dump_schema

from stepstone.store.sqlite import SqliteStore

with tempfile.TemporaryDirectory() as folder:
    store = SqliteStore(f"{folder}/schema.db")
    store.migrate()
    store.close()
    SCHEMA_SNAPSHOT.write_text(dump_schema(f"{folder}/schema.db"))
print(f"wrote {SCHEMA_SNAPSHOT}")
