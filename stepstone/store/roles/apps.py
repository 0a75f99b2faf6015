"""The apps role: the endpoints ``stepstone server`` serves functions from
(``ss.serve`` behind a URL). Their functions are registered through
``FunctionsTx`` under the app's name; this role keeps what the server knows
about each endpoint (the last sync and its error)."""

from __future__ import annotations

from typing import Protocol

from stepstone.store.viewrows import AppRow


class AppsTx(Protocol):
    """The registry of apps served over HTTP, by URL (``stepstone.appsync``)."""

    def upsert_app(self, row: AppRow) -> None:
        """Record a good sync of ``row.url``: every column but ``created_at``
        (kept from the first sync) is replaced; ``error`` is cleared."""
        ...

    def record_app_error(self, url: str, error: str, now: float) -> bool:
        """Note a failed sync of a registered app; ``False`` if ``url`` is not one."""
        ...

    def get_app(self, url: str) -> AppRow | None:
        """The app served at ``url``, if registered."""
        ...

    def list_apps(self) -> list[AppRow]:
        """Every registered app, by URL."""
        ...

    def delete_app(self, url: str) -> bool:
        """Forget the app served at ``url``; ``False`` if it was not registered."""
        ...

    def retire_app_functions(self, app: str, now: float) -> int:
        """Retire every function ``app`` registered (events stop starting runs of
        them); returns how many were live."""
        ...
