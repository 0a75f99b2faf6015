"""Bulk cancel, replay and resume: validated whole, then run as background jobs."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.status import HTTP_202_ACCEPTED

from stepstone.expressions import compile_expression
from stepstone.server.errors import documented
from stepstone.server.jobs import CANCEL_MANY, REPLAY_MANY, RESUME_MANY, BulkRequest
from stepstone.server.params import check_range, parse_moment
from stepstone.server.schemas import CancelManyIn, JobOut, ReplayManyIn, ResumeManyIn
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("runs")

    async def start(kind: str, body: CancelManyIn, statuses: tuple[str, ...] = ()) -> JobOut:
        lo, hi = parse_moment(body.since, "since"), parse_moment(body.until, "until")
        check_range(lo, hi)
        if body.if_ is not None:
            compile_expression(body.if_, field="if")
        await state.require_function(body.function_id)
        request = BulkRequest(kind, body.function_id, lo, hi, body.if_, statuses)
        return JobOut.of(await state.jobs.start(request))

    @router.post(
        "/runs/cancel-many",
        response_model=JobOut,
        status_code=HTTP_202_ACCEPTED,
        responses=documented(413, 415),
        summary="Cancel many runs (a background job)",
    )
    async def cancel_many(body: CancelManyIn) -> JobOut:
        """Starts a job cancelling the function's active runs created in
        [since, until) whose first event satisfies `if`; follow it at /api/v1/jobs/{id}."""
        return await start(CANCEL_MANY, body)

    @router.post(
        "/runs/replay-many",
        response_model=JobOut,
        status_code=HTTP_202_ACCEPTED,
        responses=documented(413, 415),
        summary="Replay many runs (a background job)",
    )
    async def replay_many(body: ReplayManyIn) -> JobOut:
        """Starts a job replaying the function's runs with the given statuses (default
        failed); follow it at /api/v1/jobs/{id}."""
        return await start(REPLAY_MANY, body, tuple(body.status))

    @router.post(
        "/runs/resume-many",
        response_model=JobOut,
        status_code=HTTP_202_ACCEPTED,
        responses=documented(413, 415),
        summary="Resume many paused runs (a background job)",
    )
    async def resume_many(body: ResumeManyIn) -> JobOut:
        """Starts a job resuming the function's paused runs created in [since, until)
        whose first event satisfies `if`; follow it at /api/v1/jobs/{id}."""
        return await start(RESUME_MANY, body)

    return router
