"""Background jobs: bulk cancel, replay and resume started over HTTP.

A job is a row in the ``jobs`` table and an asyncio task in the server that
created it. The task drives ``app.runs.cancel_many_async`` /
``replay_many_async`` / ``resume_many_async`` and records their progress after every page; a heartbeat
refreshes the row while the task lives. A job whose row stops being refreshed
(its server died or restarted) is marked ``interrupted`` the next time anyone
reads it; a server that shuts down cleanly marks its own jobs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepstone.errors import NotFoundError, StepstoneError
from stepstone.ids import new_id
from stepstone.store.base import JobsTx
from stepstone.store.viewrows import JOB_ACTIVE_STATUSES, JobRow, JobStatus
from stepstone.worker import default_instance_id

if TYPE_CHECKING:
    from stepstone.app import App

log = logging.getLogger("stepstone.server.jobs")
CANCEL_MANY, REPLAY_MANY, RESUME_MANY = "cancel_many", "replay_many", "resume_many"
_SHUTDOWN = "interrupted: the server shut down"


@dataclass(frozen=True)
class BulkRequest:
    """A validated bulk action (times in epoch seconds)."""

    kind: str
    function_id: str
    since: float | None = None
    until: float | None = None
    if_: str | None = None
    statuses: tuple[str, ...] = ()

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "function_id": self.function_id,
            "since": self.since,
            "until": self.until,
            "if": self.if_,
        }
        if self.kind == REPLAY_MANY:
            out["status"] = list(self.statuses)
        return out


@dataclass
class _Progress:
    job_id: str
    done: int = 0
    examined: int = 0
    writes: set[asyncio.Future[Any]] = field(default_factory=set)


class JobRunner:
    def __init__(self, app: App, *, heartbeat: float = 5.0, stale_after: float = 30.0) -> None:
        self.app = app
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self.owner = default_instance_id()
        self.tasks: dict[str, asyncio.Task[None]] = {}

    # -- starting --------------------------------------------------------------------------
    async def start(self, request: BulkRequest) -> JobRow:
        now = self.app.clock.now()
        job = JobRow(
            id=new_id(now),
            kind=request.kind,
            status=JobStatus.RUNNING,
            params=json.dumps(request.params()),
            created_at=now,
            updated_at=now,
            owner=self.owner,
        )

        def create(tx: JobsTx) -> None:
            tx.create_job(job)

        await self.app.store.transact(create)
        task = asyncio.create_task(self._execute(job, request), name=f"stepstone-job-{job.id}")
        self.tasks[job.id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(job.id, None))
        return job

    async def _execute(self, job: JobRow, request: BulkRequest) -> None:
        progress = _Progress(job.id)
        beat = asyncio.create_task(self._beat(progress))
        try:
            await self._bulk(request, progress)
            await self._record(progress, JobStatus.COMPLETED, None, final=True)
        except asyncio.CancelledError:
            await asyncio.shield(self._record(progress, JobStatus.INTERRUPTED, _SHUTDOWN, final=True))
            raise
        except StepstoneError as exc:
            await self._record(progress, JobStatus.FAILED, f"{type(exc).__name__}: {exc}", final=True)
        except Exception as exc:
            log.exception("job %s crashed", job.id)
            await self._record(progress, JobStatus.FAILED, f"{type(exc).__name__}: {exc}", final=True)
        finally:
            beat.cancel()

    async def _bulk(self, request: BulkRequest, progress: _Progress) -> int:
        def report(done: int, examined: int) -> None:
            progress.done, progress.examined = done, examined
            future = self.app.store.submit(self._update_op(progress, JobStatus.RUNNING, None, final=False))
            progress.writes.add(future)
            future.add_done_callback(_forget(progress.writes))

        filters: dict[str, Any] = {
            "function_id": request.function_id,
            "since": request.since,
            "until": request.until,
            "if_": request.if_,
            "progress": report,
        }
        if request.kind == CANCEL_MANY:
            return await self.app.runs.cancel_many_async(**filters)
        if request.kind == RESUME_MANY:
            return await self.app.runs.resume_many_async(**filters)
        return await self.app.runs.replay_many_async(status=request.statuses, **filters)

    async def _beat(self, progress: _Progress) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            with contextlib.suppress(StepstoneError):
                await self._record(progress, JobStatus.RUNNING, None, final=False)

    async def _record(
        self, progress: _Progress, status: JobStatus, error: str | None, *, final: bool
    ) -> None:
        await self.app.store.transact(self._update_op(progress, status, error, final=final))

    def _update_op(self, progress: _Progress, status: JobStatus, error: str | None, *, final: bool) -> Any:
        now = self.app.clock.now()
        done, examined = progress.done, progress.examined

        def op(tx: JobsTx) -> bool:
            return tx.update_job(
                progress.job_id,
                status=status,
                done=done,
                examined=examined,
                error=error,
                now=now,
                finished_at=now if final else None,
            )

        return op

    # -- reading ----------------------------------------------------------------------------------
    async def get(self, job_id: str) -> JobRow:
        job = await self.app.store.read(lambda tx: tx.get_job(job_id))
        if job is None:
            raise NotFoundError(f"no job {job_id!r}")
        if self._stale(job):
            await self.sweep()
            job = await self.app.store.read(lambda tx: tx.get_job(job_id))
            assert job is not None
        return job

    async def list(self, limit: int) -> list[JobRow]:
        jobs = await self.app.store.read(lambda tx: tx.list_jobs(limit))
        if any(self._stale(job) for job in jobs):
            await self.sweep()
            jobs = await self.app.store.read(lambda tx: tx.list_jobs(limit))
        return jobs

    def _stale(self, job: JobRow) -> bool:
        return (
            job.status in JOB_ACTIVE_STATUSES
            and job.id not in self.tasks
            and job.updated_at < self.app.clock.now() - self.stale_after
        )

    async def sweep(self) -> int:
        """Mark jobs whose server stopped refreshing them as ``interrupted``."""
        now = self.app.clock.now()
        reason = f"interrupted: no progress for {self.stale_after:g}s (its server stopped)"
        return await self.app.store.transact(
            lambda tx: tx.interrupt_stale_jobs(now - self.stale_after, now, reason)
        )

    async def shutdown(self) -> None:
        """Stop this server's jobs and record them as ``interrupted`` (a job that
        had not begun yet, or had just finished, is recorded here)."""
        jobs = dict(self.tasks)
        for task in jobs.values():
            task.cancel()
        await asyncio.gather(*jobs.values(), return_exceptions=True)
        for job_id in jobs:
            with contextlib.suppress(StepstoneError):
                await self._record(_Progress(job_id), JobStatus.INTERRUPTED, _SHUTDOWN, final=True)


def _forget(writes: set[asyncio.Future[Any]]) -> Any:
    def done(future: asyncio.Future[Any]) -> None:
        writes.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("job progress not recorded: %s", future.exception())

    return done
