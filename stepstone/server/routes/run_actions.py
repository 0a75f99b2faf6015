"""Acting on one run: cancel, replay, resume, rerun from a step, signal."""

from __future__ import annotations

from fastapi import APIRouter

from stepstone.server.errors import documented
from stepstone.server.routes.runs import RunId
from stepstone.server.schemas import RerunIn, RerunOut, RunStatusOut, SignalIn, SignalOut
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
        "/runs/{run_id}/resume",
        response_model=RunStatusOut,
        responses=documented(404, 409),
        summary="Resume a paused run",
    )
    async def resume(run_id: RunId) -> RunStatusOut:
        """Queue a run paused on a divergence again, with its history, under the code
        deployed now (it pauses again if that code still diverges)."""
        await runs.resume_async(run_id)
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

    @router.post(
        "/runs/{run_id}/signals",
        response_model=SignalOut,
        responses=documented(404, 409, 413, 415, 422),
        summary="Send a signal to a run",
    )
    async def signal(run_id: RunId, body: SignalIn) -> SignalOut:
        """Buffered until the run's `wait_for_signal(name)` receives it (at once if one
        is waiting); each signal is received once, in the order sent. 409 if the
        run has ended."""
        signal_id = await runs.signal_async(run_id, body.name, body.data)
        return SignalOut(id=signal_id, run_id=run_id, name=body.name)

    return router
