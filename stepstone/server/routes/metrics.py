"""``GET /metrics``: Prometheus text; needs the API key (it names functions and volumes)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from stepstone import metrics
from stepstone.server.state import ServerState
from stepstone.store.base import ViewsTx


def build(state: ServerState) -> APIRouter:
    router = state.router("metrics", prefix="")

    @router.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics",
        responses={
            200: {
                "content": {"text/plain": {"schema": {"type": "string"}}},
                "description": "Prometheus text exposition format",
            }
        },
    )
    async def scrape() -> Response:
        """This process's run and step counters plus, computed now from the database,
        the backlog per function and active runs per function and status."""
        now = state.app.clock.now()

        def op(tx: ViewsTx) -> metrics.StoreSnapshot:
            return metrics.StoreSnapshot(now, tx.run_backlog(now), tx.count_active_runs())

        snapshot = await state.app.store.read(op)
        return Response(metrics.render(snapshot), media_type=metrics.CONTENT_TYPE)

    return router
