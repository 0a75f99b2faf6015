"""The push model's executor: ``stepstone server`` runs the functions of apps
served over HTTP (``ss.serve``) by calling their endpoints.

Each served app (an endpoint URL in its functions' catalog descriptions,
``"serve_url"``) gets a ``Worker`` of its own whose registry is that app's
functions, so leasing, flow control, fairness, fencing, heartbeats, cron
ticks and timeouts are exactly a worker's; only the invocation differs: the
leased run goes to the endpoint in one signed POST (``wire.encode_request``),
and the signed answer (staged memos, spans, effects, a decision) is committed
under the lease's fence through the journal and ``executor.settle``, the code
paths a worker's own invocation ends in. A cancel flagged while the request
was in flight wins at that commit. The worker's concurrency bounds the
requests open to one app at a time.

An endpoint that cannot be reached, times out, answers other than 200, or
answers unsigned or malformed is *unavailable*, not a failed step: the run is
parked (status ``running``) and called again after a back-off that doubles
per consecutive failure up to ``MAX_BACKOFF``, and its trace gets a warning
span ``endpoint unavailable`` saying why. Attempts and retries are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from stepstone import limits, serde
from stepstone.bodies import BodyTooLarge, read_capped
from stepstone.catalog import rebuild
from stepstone.clock import Clock
from stepstone.errors import ErrorInfo
from stepstone.executor import ExecEnv, Outcome, execute, settle
from stepstone.function import FunctionDef
from stepstone.introspection import SERVE_URL
from stepstone.journal import RunJournal
from stepstone.registry import Registry
from stepstone.signals import CancelSignal
from stepstone.signing import SIGNATURE_HEADER, SignatureError, SigningKeys, sign, verify
from stepstone.store.base import Store, Tx
from stepstone.store.rows import ENDED_STATUSES, LeasedRun, RunStatus, StepStatus
from stepstone.wire import Answer, Decision, WireError, encode_request
from stepstone.worker import Worker, default_instance_id

log = logging.getLogger("stepstone.pusher")
FIRST_BACKOFF, MAX_BACKOFF = 1.0, 60.0  # seconds before calling an unavailable endpoint again
UNAVAILABLE = "endpoint unavailable"


@dataclass(frozen=True, kw_only=True)
class PushSettings:
    """``concurrency``: requests open to one app at once; ``timeout``: seconds an
    endpoint may take to answer (above its ``max_duration``); ``refresh``:
    seconds between looks at the catalog for served apps."""

    concurrency: int = 32
    timeout: float = 90.0
    refresh: float = 2.0
    lease_ttl: float = 15.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("push concurrency must be at least 1")


class Unavailable(Exception):
    """The endpoint gave no usable answer (the run is retried, not failed)."""


async def _read_capped(response: httpx.Response) -> bytes:
    """The answer's body, read no further than the cap (whether or not it says its length)."""
    try:
        declared = int(response.headers.get("content-length") or 0)
        return await read_capped(response.aiter_bytes(), limits.MAX_PUSH_BYTES, declared)
    except BodyTooLarge:
        raise Unavailable(
            f"HTTP {response.status_code}: an answer over {limits.MAX_PUSH_BYTES} bytes"
        ) from None


class Endpoint:
    """One served app's URL: signed requests, verified answers, back-off state."""

    def __init__(
        self,
        url: str,
        keys: SigningKeys,
        settings: PushSettings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.keys = keys
        limits_ = httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=8)
        self.http = httpx.AsyncClient(timeout=settings.timeout, limits=limits_, transport=transport)
        self.failures: dict[str, int] = {}  # run id -> consecutive unavailable answers

    async def call(self, body: bytes) -> Answer:
        headers = {SIGNATURE_HEADER: sign(body, self.keys), "content-type": "application/json"}
        try:
            async with self.http.stream("POST", self.url, content=body, headers=headers) as response:
                content = await _read_capped(response)
        except httpx.HTTPError as exc:
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
        try:
            verify(response.headers.get(SIGNATURE_HEADER), content, self.keys)
        except SignatureError as exc:
            raise Unavailable(f"HTTP {response.status_code}: the answer's signature: {exc}") from exc
        if response.status_code != 200:
            raise Unavailable(f"HTTP {response.status_code}: {content[:500].decode(errors='replace')}")
        try:
            return Answer.decode(content)
        except WireError as exc:
            raise Unavailable(f"HTTP 200: {exc}") from exc

    def backoff(self, run_id: str) -> tuple[int, float]:
        failures = self.failures[run_id] = self.failures.get(run_id, 0) + 1
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (failures - 1))
        return failures, delay * (0.75 + random.random() / 2)

    async def close(self) -> None:
        await self.http.aclose()


async def push(leased: LeasedRun, env: ExecEnv, endpoint: Endpoint) -> Outcome | None:
    """One invocation of a leased run, executed by its endpoint."""

    async def over_http(fn: FunctionDef, leased: LeasedRun, journal: RunJournal, env: ExecEnv) -> Outcome:
        outcome = await _invoke_remote(leased, journal, env, endpoint)
        if outcome.status in ENDED_STATUSES:
            endpoint.failures.pop(leased.run.id, None)
        return outcome

    return await execute(leased, env, over_http)


async def _with_outputs(leased: LeasedRun, env: ExecEnv) -> LeasedRun:
    """The lease carries the step index only; the request carries every recorded
    output (read a page at a time), as the endpoint has no database."""
    memos = env.memos(leased)
    steps = [
        dataclasses.replace(step, output=await memos.output(step))
        if step.status == StepStatus.COMPLETED
        else step
        for step in sorted(leased.steps, key=lambda s: s.position)
    ]
    return dataclasses.replace(leased, steps=steps)


def refusal(answer: Answer, leased: LeasedRun, request_id: str) -> str | None:
    """Why a signed answer must not be committed (``None``: it may be). The
    endpoint is trusted with its own request only: an answer to another request
    (a captured one, replayed), one writing to another run, or one restaging a
    step the run already completed (a completed memo is never overwritten)."""
    if answer.request_id != request_id:
        return "the answer is to another request"
    if answer.run_ids() - {leased.run.id}:
        return "the answer writes to another run"
    completed = {s.step_id for s in leased.steps if s.status == StepStatus.COMPLETED}
    restaged = sorted({s.step_id for s in answer.steps} & completed)
    if restaged:
        return f"the answer rewrites completed step(s) {', '.join(map(repr, restaged))}"
    return None


async def _invoke_remote(leased: LeasedRun, journal: RunJournal, env: ExecEnv, endpoint: Endpoint) -> Outcome:
    request_id = secrets.token_hex(16)
    body = encode_request(await _with_outputs(leased, env), request_id)
    if len(body) > limits.MAX_PUSH_BYTES:
        message = (
            f"the run's state is {len(body)} bytes, over the {limits.MAX_PUSH_BYTES} an invocation carries"
        )
        failed = Decision(status=RunStatus.FAILED, error=ErrorInfo("LimitExceededError", message))
        return await settle(failed, leased, journal, env)
    try:
        answer = await endpoint.call(body)
        why = refusal(answer, leased, request_id)
        if why is not None:
            raise Unavailable(f"HTTP 200: {why}")
    except Unavailable as exc:
        return await _unavailable(leased, journal, env, endpoint, str(exc))
    endpoint.failures.pop(leased.run.id, None)
    return await _commit(answer, leased, journal, env)


async def _commit(answer: Answer, leased: LeasedRun, journal: RunJournal, env: ExecEnv) -> Outcome:
    """The answer's memos, spans and effects, then its decision, under the fence."""
    for step in answer.steps:
        journal.stage(step, None)
    journal.spans.extend(answer.spans)
    journal.effects.extend(env.effect(record) for record in answer.effects)
    decision = answer.decision
    if answer.deferred is not None:
        await journal.apply(env.effect(answer.deferred))
    if decision.status in ENDED_STATUSES:
        try:  # a cancel flagged while the request was in flight wins, as at a worker's step boundary
            await journal.flush()
        except CancelSignal:
            decision = Decision(status=RunStatus.CANCELLED)
    return await settle(decision, leased, journal, env)


async def _unavailable(
    leased: LeasedRun, journal: RunJournal, env: ExecEnv, endpoint: Endpoint, why: str
) -> Outcome:
    failures, delay = endpoint.backoff(leased.run.id)
    log.warning(
        "run %s: %s %s (%s); calling again in %.1fs", leased.run.id, UNAVAILABLE, endpoint.url, why, delay
    )
    detail = {"url": endpoint.url, "error": why, "failures": failures, "retry_in": round(delay, 3)}
    journal.warn(UNAVAILABLE, serde.dumps(detail, what="span detail"))
    parked = Decision(status=RunStatus.RUNNING, wake_at=env.clock.now() + delay, attempt=leased.run.attempt)
    return await settle(parked, leased, journal, env)


def served_apps(registry: Iterable[FunctionDef]) -> dict[str, list[FunctionDef]]:
    """The functions served over HTTP among ``registry``'s, by endpoint URL."""
    apps: dict[str, list[FunctionDef]] = {}
    for fn in registry:
        url = fn.options.get(SERVE_URL)
        if isinstance(url, str) and url:
            apps.setdefault(url, []).append(fn)
    return apps


def _without_crons(config: str) -> FunctionDef:
    description = json.loads(config)
    triggers = [t for t in description.get("triggers", []) if "cron" not in t]
    return rebuild({**description, "triggers": triggers})


def draining(tx: Tx) -> list[FunctionDef]:
    """Retired functions served over HTTP (their app unregistered, or a re-sync
    dropped them) that still have runs not ended: the pusher keeps executing
    those runs at the URL that served them, as an old worker drains what it
    hosts (the endpoint finishes them, or fails each with ``UnknownFunction``
    if it no longer serves the function). Without their cron triggers: a
    retired function starts no run."""
    retired = tx.retired_functions()
    if not retired:
        return []
    rows = tx.load_functions()
    candidates = [rows[i][1] for i in sorted(retired) if i in rows and SERVE_URL in json.loads(rows[i][1])]
    if not candidates:
        return []
    active = {row.function_id for row in tx.count_active_runs()}
    return [fn for fn in map(_without_crons, candidates) if fn.id in active]


class Pusher:
    """A worker per served app, kept in step with the catalog."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        catalog: Callable[[], Registry],
        keys: SigningKeys,
        settings: PushSettings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.store = store
        self.transport = transport  # tests: an in-process endpoint (httpx.ASGITransport)
        self.clock = clock
        self.catalog = catalog
        self.keys = keys
        self.settings = settings or PushSettings()
        self.workers: dict[str, tuple[Worker, Endpoint]] = {}
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        """Serve the apps the catalog holds now, then follow it."""
        await self._refresh_logged()
        self._task = asyncio.create_task(self._watch(), name="stepstone-pusher")

    async def stop(self, drain_timeout: float = 10.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for url in list(self.workers):
            await self._retire(url, drain_timeout)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh)
            await self._refresh_logged()

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception:
            log.exception("served apps: could not refresh from the catalog")

    async def refresh(self) -> None:
        """Start a worker for each newly served app, update the functions of
        the others (with those still ``draining``), stop those no longer served."""
        live = await asyncio.to_thread(self.catalog)
        apps = served_apps([*live, *await self.store.read(draining)])
        for url, functions in apps.items():
            registry = Registry()
            for fn in functions:
                registry.add_definition(fn)
            if url in self.workers:
                worker = self.workers[url][0]
                if worker.registry.ids() != registry.ids():
                    worker.registry = registry
                    worker.notify()
                continue
            await self._start(url, registry)
        for url in set(self.workers) - set(apps):
            await self._retire(url, 10.0)

    async def _start(self, url: str, registry: Registry) -> None:
        endpoint = Endpoint(url, self.keys, self.settings, self.transport)

        async def execute_pushed(leased: LeasedRun, env: ExecEnv) -> Outcome | None:
            return await push(leased, env, endpoint)

        worker = Worker(
            store=self.store,
            registry=registry,
            clock=self.clock,
            app_name=f"push:{url}",
            instance_id=f"{default_instance_id()}/push:{url}",
            concurrency=self.settings.concurrency,
            lease_ttl=self.settings.lease_ttl,
            matcher=self.catalog,
            execute=execute_pushed,
            retention=None,
        )
        await worker.start()
        self.workers[url] = (worker, endpoint)
        log.info("serving %d function(s) of %s over HTTP", len(registry.ids()), url)

    async def _retire(self, url: str, drain_timeout: float) -> None:
        worker, endpoint = self.workers.pop(url)
        await worker.stop(drain_timeout)
        await endpoint.close()
