"""Background jobs (bulk cancel / replay) and their progress."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from stepstone.server.errors import documented
from stepstone.server.schemas import JobList, JobOut
from stepstone.server.state import ServerState


def build(state: ServerState) -> APIRouter:
    router = state.router("jobs")

    @router.get("/jobs", response_model=JobList, summary="Recent jobs, newest first")
    async def list_jobs(limit: Annotated[int, Query(ge=1, le=500)] = 50) -> JobList:
        return JobList(jobs=[JobOut.of(j) for j in await state.jobs.list(limit)])

    @router.get(
        "/jobs/{job_id}", response_model=JobOut, responses=documented(404), summary="A job and its progress"
    )
    async def get_job(job_id: Annotated[str, Path()]) -> JobOut:
        """`status` is running, completed, failed or interrupted (its server stopped);
        `done` counts runs acted on, `examined` runs matched so far."""
        return JobOut.of(await state.jobs.get(job_id))

    return router
