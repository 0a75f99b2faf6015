"""What an app served over HTTP says about itself: the signed answer to the
server's introspection request, from which the server registers the app's
functions in its catalog (ids, triggers, flow control: ``FunctionDef.describe``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepstone.registry import Registry

PROTOCOL = 1
SERVE_URL = "serve_url"  # the catalog description's key naming the endpoint that serves a function


class AppDocumentError(ValueError):
    """An introspection answer that is not a valid app document."""


@dataclass(frozen=True, kw_only=True)
class AppDocument:
    """An app's name, version, time budget per request and function descriptions."""

    app: str
    app_version: str | None
    max_duration: float
    functions: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "app": self.app,
            "app_version": self.app_version,
            "max_duration": self.max_duration,
            "functions": list(self.functions),
        }

    @classmethod
    def from_json(cls, raw: Any) -> AppDocument:
        """Parse and check the shape; ``AppDocumentError`` says what is wrong."""
        if not isinstance(raw, dict):
            raise AppDocumentError("an app document is a JSON object")
        if raw.get("protocol") != PROTOCOL:
            raise AppDocumentError(f"unsupported protocol {raw.get('protocol')!r} (expected {PROTOCOL})")
        app, version, budget, functions = (
            raw.get("app"),
            raw.get("app_version"),
            raw.get("max_duration"),
            raw.get("functions"),
        )
        if not isinstance(app, str) or not app:
            raise AppDocumentError("'app' must be a non-empty string")
        if version is not None and not isinstance(version, str):
            raise AppDocumentError("'app_version' must be a string or null")
        if isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0:
            raise AppDocumentError("'max_duration' must be a positive number of seconds")
        if not isinstance(functions, list) or not all(
            isinstance(f, dict) and isinstance(f.get("id"), str) and f["id"].strip() for f in functions
        ):
            raise AppDocumentError("'functions' must be a list of objects with a non-empty 'id'")
        return cls(app=app, app_version=version, max_duration=float(budget), functions=tuple(functions))


def describe_app(
    name: str, registry: Registry, *, app_version: str | None, max_duration: float
) -> AppDocument:
    """The document an endpoint serving ``registry``'s functions answers with."""
    return AppDocument(
        app=name,
        app_version=app_version,
        max_duration=max_duration,
        functions=tuple(fn.describe() for fn in registry),
    )
