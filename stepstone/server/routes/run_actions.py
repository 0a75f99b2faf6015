"""Acting on one run: cancel, replay, rerun from a step."""

from __future__ import annotations

from fastapi import APIRouter

from stepstone.server.errors import documented
from stepstone.server.routes.runs import RunId
from stepstone.server.schemas import RerunIn, RerunOut, RunStatusOut
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("runs")
    runs = state.app.runs

    @router.post(
        "/runs/{run_id}/cancel",
        response_model=RunStatusOut,
        responses=documented(404),
        summary="Cancel a run",
    )
    async def cancel(run_id: RunId) -> RunStatusOut:
        """An idle run is cancelled at once; a run executing a step ends after that step
        (its status stays active until then)."""
        return RunStatusOut(id=run_id, status=await runs.cancel_async(run_id))

    @router.post(
        "/runs/{run_id}/replay",
        response_model=RunStatusOut,
        responses=documented(404, 409),
        summary="Replay a failed or cancelled run",
    )
    async def replay(run_id: RunId) -> RunStatusOut:
        await runs.replay_async(run_id)
        return RunStatusOut(id=run_id, status=(await runs.get_async(run_id)).status)

    @router.post(
        "/runs/{run_id}/rerun",
        response_model=RerunOut,
        responses=documented(404, 409, 413, 415, 422),
        summary="Fork a new run from a step",
    )
    async def rerun(run_id: RunId, body: RerunIn) -> RerunOut:
        """A new run keeping the steps before `step_id` and re-executing from it;
        with `event_data`, the new run starts with that event data."""
        new = await runs.rerun_from_async(run_id, body.step_id, body.event_data)
        return RerunOut(id=new, rerun_of=run_id, step_id=body.step_id)

    return router
