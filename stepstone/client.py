"""``ss.Client``: send events and manage runs on a remote Stepstone server.

It mirrors ``app.send`` and ``app.runs`` (same names, same ``ss.Run`` /
``ss.Span`` results, same errors). The async methods are the implementation;
each sync method is derived from its ``_async`` twin by ``_sync`` and runs it on
the client's portal (``bridge.Portal``: an event loop thread). httpx clients are
kept per event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from stepstone import errors
from stepstone.bridge import Portal, portal_face
from stepstone.durations import Duration, parse_duration
from stepstone.events import Event, validate_event
from stepstone.inventory import DatabaseStats, FunctionInfo
from stepstone.runs import Run, Span
from stepstone.store.rows import RunStatus
from stepstone.store.viewrows import AppRow, JobStatus, WorkerRow

if TYPE_CHECKING:
    import httpx

S = TypeVar("S", bound="_Remote")
P = ParamSpec("P")
T = TypeVar("T")
Moment = datetime | float | int
Progress = Callable[[int, int], Any]
PAGE = 500  # the server's largest page


def _sync(fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]]) -> Callable[Concatenate[S, P], T]:
    """The blocking twin of an ``async`` method, run on the client's portal."""
    return portal_face(fn, _portal_of)


def _portal_of(remote: _Remote) -> Portal:
    return remote._client._portal()


class _Remote:
    _client: Client


def _moment(value: Moment | None) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else repr(float(value))


def _error(response: httpx.Response) -> errors.StepstoneError:
    """The Stepstone error a failed response stands for."""
    try:
        detail = response.json()["error"]
        kind, message, field = str(detail["type"]), str(detail["message"]), detail.get("field")
    except (ValueError, KeyError, TypeError):
        kind, message, field = "", response.text[:300], None
    if kind == "ConfigError" or (not kind and response.status_code == 422):
        field = field or "request"
        return errors.ConfigError(field, message.removeprefix(f"{field}: "))
    cls = _ERRORS.get(kind) or _BY_STATUS.get(response.status_code)
    if cls is not None:
        return cls(message)
    return errors.StepstoneError(f"HTTP {response.status_code}: {message}")


def _error_classes() -> dict[str, type[errors.StepstoneError]]:
    from stepstone.events import InvalidEventError

    classes: list[type[errors.StepstoneError]] = [
        errors.NotFoundError,
        errors.InvalidStateError,
        errors.LimitExceededError,
        errors.ExpressionError,
        errors.SerializationError,
        errors.RunTimeoutError,
        errors.StoreError,
        errors.StoreUnavailableError,
        errors.AuthenticationError,
        errors.EndpointError,
        InvalidEventError,
    ]
    return {cls.__name__: cls for cls in classes}


_ERRORS = _error_classes()
_BY_STATUS: dict[int, type[errors.StepstoneError]] = {
    401: errors.AuthenticationError,
    404: errors.NotFoundError,
    409: errors.InvalidStateError,
    413: errors.LimitExceededError,
    502: errors.EndpointError,
    503: errors.ServerUnavailableError,
}


class Client(_Remote):
    """A remote Stepstone: ``Client("http://host:8288", api_key=..., event_key=...)``.

    ``send`` uses the event key when given, else the API key; everything else
    needs the API key. Close it (or use ``with``) to release connections.
    """

    def __init__(
        self, url: str, *, api_key: str | None = None, event_key: str | None = None, timeout: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.event_key = event_key
        self.timeout = timeout
        self.runs = RemoteRuns(self)
        self.functions = RemoteFunctions(self)
        self.workers = RemoteWorkers(self)
        self.apps = RemoteApps(self)
        self._client = self
        self._lock = threading.Lock()
        self._portal_: Portal | None = None
        self._http_: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    # -- plumbing ------------------------------------------------------------------------------
    def _portal(self) -> Portal:
        with self._lock:
            if self._portal_ is None:
                self._portal_ = Portal("stepstone-client")
            return self._portal_

    def _http(self) -> httpx.AsyncClient:
        import httpx

        loop = asyncio.get_running_loop()
        client = self._http_.get(loop)
        if client is None:
            client = self._http_[loop] = httpx.AsyncClient(base_url=self.url, timeout=self.timeout)
        return client

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        key: str | None = None,
    ) -> Any:
        """One API call; returns the decoded JSON or raises the matching Stepstone error."""
        import httpx

        token = key if key is not None else self.api_key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http().request(method, path, json=json, params=query, headers=headers)
        except httpx.TransportError as exc:
            raise errors.ServerUnavailableError(f"cannot reach {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

    call = _sync(request)  # the blocking twin of ``request``

    # -- events --------------------------------------------------------------------------------
    async def send_async(self, events: Event | Sequence[Event]) -> builtins.list[str]:
        """Record events on the server; returns their ids (see ``App.send``)."""
        batch = [events] if isinstance(events, Event) else list(events)
        for event in batch:
            validate_event(event)
        body = await self.request(
            "POST", "/api/v1/events", json=[e.to_json() for e in batch], key=self.event_key or self.api_key
        )
        return [str(i) for i in body["ids"]]

    send = _sync(send_async)

    # -- the database ---------------------------------------------------------------------------
    async def stats_async(self) -> DatabaseStats:
        """Rows and bytes per table, the database's size and the oldest ended run
        (``stepstone stats``; ``GET /api/v1/stats``)."""
        from stepstone.server.schemas import DatabaseStatsOut

        return DatabaseStatsOut.model_validate(await self.request("GET", "/api/v1/stats")).to_stats()

    stats = _sync(stats_async)

    # -- lifecycle -------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the connections of the current event loop's client."""
        client = self._http_.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        with self._lock:
            portal, self._portal_ = self._portal_, None
        if portal is not None:
            portal.call(self.aclose())
            portal.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        self.close()


class RemoteRuns(_Remote):
    """``client.runs``: the same methods as ``app.runs``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def get_async(self, run_id: str) -> Run:
        from stepstone.server.schemas import RunOut

        return RunOut.model_validate(await self._client.request("GET", _run_path(run_id))).to_run()

    async def list_async(
        self,
        *,
        function_id: str | None = None,
        event_id: str | None = None,
        status: str | Sequence[str] | None = None,
        since: Moment | None = None,
        until: Moment | None = None,
        limit: int = 100,
        before: str | None = None,
        app_version: str | None = None,
    ) -> builtins.list[Run]:
        """Newest first, like ``app.runs.list``; pages are fetched as needed."""
        from stepstone.server.params import encode_cursor
        from stepstone.server.schemas import RunPage

        statuses = [status] if isinstance(status, str) else list(status or [])
        params: dict[str, Any] = {
            "function_id": function_id,
            "event_id": event_id,
            "status": statuses or None,
            "since": _moment(since),
            "until": _moment(until),
            "cursor": encode_cursor(before) if before else None,
            "app_version": app_version,
        }
        found: builtins.list[Run] = []
        while True:
            params["limit"] = min(PAGE, limit - len(found))
            page = RunPage.model_validate(await self._client.request("GET", "/api/v1/runs", params=params))
            found.extend(r.to_run() for r in page.runs)
            if page.next_cursor is None or len(found) >= limit:
                return found
            params["cursor"] = page.next_cursor

    async def trace_async(self, run_id: str) -> builtins.list[Span]:
        from stepstone.server.schemas import TraceOut

        body = await self._client.request("GET", f"{_run_path(run_id)}/trace")
        return [s.to_span() for s in TraceOut.model_validate(body).spans]

    async def export_async(self, run_id: str) -> dict[str, Any]:
        """The run's history (``app.runs.export``)."""
        body: dict[str, Any] = await self._client.request("GET", f"{_run_path(run_id)}/history")
        return body

    async def cancel_async(self, run_id: str) -> str:
        return str((await self._client.request("POST", f"{_run_path(run_id)}/cancel"))["status"])

    async def replay_async(self, run_id: str) -> None:
        await self._client.request("POST", f"{_run_path(run_id)}/replay")

    async def resume_async(self, run_id: str) -> None:
        await self._client.request("POST", f"{_run_path(run_id)}/resume")

    async def rerun_from_async(
        self, run_id: str, step_id: str, event_data: dict[str, Any] | None = None
    ) -> str:
        payload: dict[str, Any] = {"step_id": step_id}
        if event_data is not None:
            payload["event_data"] = event_data
        body = await self._client.request("POST", f"{_run_path(run_id)}/rerun", json=payload)
        return str(body["id"])

    async def signal_async(self, run_id: str, name: str, data: Any = None) -> str:
        """Send a signal to the run, like ``app.runs.signal``; returns its id."""
        body = {"name": name, "data": data}
        return str((await self._client.request("POST", f"{_run_path(run_id)}/signals", json=body))["id"])

    async def wait_async(self, run_id: str, timeout: Duration = "30s") -> Run:
        """Poll until the run ends; ``RunTimeoutError`` if it does not in time."""
        deadline = time.monotonic() + parse_duration(timeout, field="timeout")
        interval = 0.01
        while True:
            run = await self.get_async(run_id)
            remaining = deadline - time.monotonic()
            if run.ended:
                return run
            if remaining <= 0:
                raise errors.RunTimeoutError(f"run {run_id} still {run.status} after {timeout}")
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, 0.25)

    async def cancel_many_async(
        self,
        *,
        function_id: str,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Start a bulk cancel job on the server and wait for it; returns the count."""
        return await self._job(
            "/api/v1/runs/cancel-many", _bulk_body(function_id, since, until, if_), progress
        )

    async def replay_many_async(
        self,
        *,
        function_id: str,
        status: str | Sequence[str] = RunStatus.FAILED,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Start a bulk replay job on the server and wait for it; returns the count."""
        statuses = [status] if isinstance(status, str) else list(status)
        body = {**_bulk_body(function_id, since, until, if_), "status": statuses}
        return await self._job("/api/v1/runs/replay-many", body, progress)

    async def resume_many_async(
        self,
        *,
        function_id: str,
        since: Moment | None = None,
        until: Moment | None = None,
        if_: str | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Start a bulk resume job on the server and wait for it; returns the count."""
        return await self._job(
            "/api/v1/runs/resume-many", _bulk_body(function_id, since, until, if_), progress
        )

    async def _job(self, path: str, body: dict[str, Any], progress: Progress | None) -> int:
        from stepstone.server.schemas import JobOut

        job = JobOut.model_validate(await self._client.request("POST", path, json=body))
        seen, interval = (-1, -1), 0.02
        while True:
            if progress is not None and (job.done, job.examined) != seen:
                seen = (job.done, job.examined)
                progress(job.done, job.examined)
            if job.finished:
                break
            await asyncio.sleep(interval)
            interval = min(interval * 2, 0.5)
            job = JobOut.model_validate(await self._client.request("GET", f"/api/v1/jobs/{job.id}"))
        if job.status != JobStatus.COMPLETED:
            raise errors.StepstoneError(f"bulk job {job.id} {job.status}: {job.error}")
        return job.done

    get = _sync(get_async)
    list = _sync(list_async)
    trace = _sync(trace_async)
    export = _sync(export_async)
    cancel = _sync(cancel_async)
    replay = _sync(replay_async)
    resume = _sync(resume_async)
    rerun_from = _sync(rerun_from_async)
    signal = _sync(signal_async)
    wait = _sync(wait_async)
    cancel_many = _sync(cancel_many_async)
    replay_many = _sync(replay_many_async)
    resume_many = _sync(resume_many_async)


class RemoteFunctions(_Remote):
    """``client.functions.list()``: every function registered on the server's database."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list_async(self) -> builtins.list[FunctionInfo]:
        from stepstone.server.schemas import FunctionList

        body = await self._client.request("GET", "/api/v1/functions")
        return [f.to_info() for f in FunctionList.model_validate(body).functions]

    list = _sync(list_async)


class RemoteWorkers(_Remote):
    """``client.workers.list()``: live workers, like ``app.workers.list()``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list_async(self, alive_within: float = 60.0) -> builtins.list[WorkerRow]:
        from stepstone.server.schemas import WorkerList

        body = await self._client.request("GET", "/api/v1/workers", params={"alive_within": alive_within})
        return [w.to_row() for w in WorkerList.model_validate(body).workers]

    list = _sync(list_async)


class RemoteApps(_Remote):
    """``client.apps``: apps served over HTTP (``ss.serve``), registered by URL."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def sync_async(self, url: str) -> AppRow:
        """Register the app served at ``url``, or pick up its changes: the server
        fetches its signed function list (``EndpointError`` if it cannot)."""
        from stepstone.server.schemas import AppOut

        body = await self._client.request("POST", "/api/v1/apps", json={"url": url})
        return AppOut.model_validate(body).to_row()

    sync = _sync(sync_async)

    async def list_async(self) -> builtins.list[AppRow]:
        """Every registered app with its last sync and error."""
        from stepstone.server.schemas import AppList

        body = await self._client.request("GET", "/api/v1/apps")
        return [a.to_row() for a in AppList.model_validate(body).apps]

    list = _sync(list_async)

    async def unregister_async(self, url: str) -> AppRow:
        """Forget the app served at ``url`` and retire its functions."""
        from stepstone.server.schemas import AppOut

        body = await self._client.request("DELETE", "/api/v1/apps", params={"url": url})
        return AppOut.model_validate(body).to_row()

    unregister = _sync(unregister_async)


def _bulk_body(
    function_id: str, since: Moment | None, until: Moment | None, if_: str | None
) -> dict[str, Any]:
    """The filters every bulk action takes."""
    return {"function_id": function_id, "since": _moment(since), "until": _moment(until), "if": if_}


def _run_path(run_id: str) -> str:
    from urllib.parse import quote

    return f"/api/v1/runs/{quote(run_id, safe='')}"
