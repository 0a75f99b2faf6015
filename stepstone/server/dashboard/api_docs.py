"""``/docs``: the API reference, rendered here from the OpenAPI schema.

No Swagger UI or ReDoc: those load their scripts from a CDN, and a server must
document itself offline. The page lists every operation with its parameters,
body and responses, and says which key it needs (``x-stepstone-key``) or that
it is open. It needs no login: it shows no data, only what ``/openapi.json``
already publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from stepstone.server.dashboard.web import render
from stepstone.server.routing import KEY_EXTENSION

KEY_NAMES = {"api": "API key", "ingest": "event key or API key"}
METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True, kw_only=True)
class Operation:
    method: str
    path: str
    summary: str
    description: str
    key: str  # "API key", "event key or API key" or "open"
    parameters: list[dict[str, Any]] = field(default_factory=list)
    body: str | None = None
    responses: list[tuple[str, str]] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return f"{self.method}-{self.path.strip('/').replace('/', '-').replace('{', '').replace('}', '')}"


def _schema_name(content: dict[str, Any] | None) -> str | None:
    schema = ((content or {}).get("application/json") or {}).get("schema") or {}
    ref = schema.get("$ref") or (schema.get("items") or {}).get("$ref")
    if ref:
        return str(ref).rsplit("/", 1)[-1]
    return "JSON" if schema else None


def operations(schema: dict[str, Any]) -> list[Operation]:
    """Every operation of ``schema``, in the order the API declares them."""
    found = []
    for path, methods in schema.get("paths", {}).items():
        for method in METHODS:
            op = methods.get(method)
            if op is None:
                continue
            found.append(
                Operation(
                    method=method.upper(),
                    path=path,
                    summary=op.get("summary", ""),
                    description=op.get("description", ""),
                    key=KEY_NAMES.get(op.get(KEY_EXTENSION, ""), "open"),
                    parameters=op.get("parameters", []),
                    body=_schema_name((op.get("requestBody") or {}).get("content")),
                    responses=[
                        (code, r.get("description", "")) for code, r in op.get("responses", {}).items()
                    ],
                )
            )
    return found


def build() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/docs")
    async def api_docs(request: Request) -> HTMLResponse:
        schema = request.app.openapi()
        found = operations(schema)
        return render(
            request,
            "api_docs.html",
            None,
            info=schema.get("info", {}),
            operations=found,
            open_paths=sorted({o.path for o in found if o.key == "open"}),
        )

    return router
