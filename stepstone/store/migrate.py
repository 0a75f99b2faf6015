"""Numbered SQL migrations per dialect (``migrations/<dialect>/NNNN_name.sql``)."""

from __future__ import annotations

from importlib import resources


def migration_files(dialect: str) -> list[tuple[str, str]]:
    """``[(name, sql)]`` in order."""
    folder = resources.files("stepstone.store").joinpath("migrations", dialect)
    files = sorted(
        (entry.name, entry.read_text()) for entry in folder.iterdir() if entry.name.endswith(".sql")
    )
    return [(name.removesuffix(".sql"), sql) for name, sql in files]


CREATE_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
)
