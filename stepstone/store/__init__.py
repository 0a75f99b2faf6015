"""Storage: the ``Store`` and ``Tx`` protocols (``base``), their SQLite and
PostgreSQL implementations, and ``make_store``, which opens one by URL.

``make_store`` lives here, above both implementations, so that ``base`` (which
they import) imports neither of them.
"""

from __future__ import annotations

from stepstone.errors import ConfigError
from stepstone.store.base import Store

__all__ = ["make_store"]


def make_store(url: str) -> Store:
    """Open the store for a ``sqlite:///path`` or ``postgresql://...`` URL."""
    if url.startswith("sqlite:"):
        from stepstone.store.sqlite import SqliteStore

        return SqliteStore.from_url(url)
    if url.startswith(("postgresql:", "postgres:")):
        from stepstone.store.postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]

        store: Store = PostgresStore.from_url(url)
        return store
    raise ConfigError("database_url", f"unsupported URL {url!r}; use sqlite:/// or postgresql://")
