"""Registering an app served over HTTP (``ss.serve``) in the store, by URL.

``stepstone server`` asks the endpoint what it serves (a ``GET`` signed with
the server's key; the answer must be signed with it too), checks every
function description by rebuilding it as the catalog would, and then, in one
transaction, registers the functions under the app's name, each description
carrying ``"serve_url"`` (how the server knows to push a function's runs to
an endpoint instead of leaving them to workers), retires the app's functions
its endpoint no longer serves (as a worker's deploy does), and records the
sync in ``apps``. Anything wrong (unreachable, refused, unsigned, invalid,
an id another app owns) writes no function; a registered app's row keeps the
failure's reason for operators.

One app name belongs to one URL and no workers: a sync retires the app's
other functions by name, so two owners of a name would retire each other's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from stepstone import limits
from stepstone.bodies import BodyTooLarge, read_capped
from stepstone.catalog import rebuild
from stepstone.clock import Clock
from stepstone.errors import (
    ConfigError,
    EndpointError,
    ExpressionError,
    InvalidStateError,
    NotFoundError,
    StepstoneError,
)
from stepstone.introspection import SERVE_URL, AppDocument, AppDocumentError
from stepstone.signing import SIGNATURE_HEADER, SignatureError, SigningKeys, sign, verify
from stepstone.store.base import AppsTx, Store, Tx
from stepstone.store.viewrows import AppRow
from stepstone.truncate import clip

if TYPE_CHECKING:
    import httpx

MAX_URL_CHARS = 2048
CONNECT_TIMEOUT = 5.0  # seconds
READ_TIMEOUT = 15.0  # seconds for the whole answer
MAX_ERROR_BYTES = 2000  # bytes of a failed sync's reason kept on the app's row
MAX_REASON_BYTES = 500  # of an endpoint's own reason for refusing
LOCK = "stepstone/apps"  # syncs and unregistrations check, then write: one at a time


def check_url(given: Any) -> str:
    """The endpoint URL, or ``ConfigError`` naming ``url``: absolute http(s),
    a host, no credentials or fragment, no spaces."""
    if not isinstance(given, str) or not given.strip():
        raise ConfigError("url", "expected a non-empty string")
    url = given.strip()
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ConfigError("url", "must contain no spaces or control characters")
    if len(url) > MAX_URL_CHARS:
        raise ConfigError("url", f"at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        _port = parts.port  # a port out of range or not a number raises here
    except ValueError as exc:
        raise ConfigError("url", f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("url", f"expected an http:// or https:// URL with a host, got {url!r}")
    if parts.username is not None or parts.password is not None or parts.fragment:
        raise ConfigError("url", "must carry no credentials and no #fragment")
    return url


# -- fetching the app document --------------------------------------------------------------------
async def _read_capped(response: httpx.Response) -> bytes:
    try:
        return await read_capped(response.aiter_bytes(), limits.MAX_REQUEST_BYTES)
    except BodyTooLarge:
        raise EndpointError(f"the endpoint's answer exceeds {limits.MAX_REQUEST_BYTES} bytes") from None


def _refusal(status: int, body: bytes) -> EndpointError:
    """The error for a non-200 answer, with the endpoint's own reason (unsigned:
    shown to operators, never trusted for anything else)."""
    try:
        message = clip(str(json.loads(body).get("message") or ""), MAX_REASON_BYTES)
    except (ValueError, AttributeError):
        message = ""
    if status == 401:
        reason = message or "no reason given"
        return EndpointError(f"the endpoint refused this server's signature (HTTP 401: {reason})")
    return EndpointError(f"the endpoint answered HTTP {status}" + (f": {message}" if message else ""))


async def fetch_document(url: str, keys: SigningKeys) -> AppDocument:
    """The endpoint's signed description of itself; ``EndpointError`` says why not."""
    import httpx

    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
    headers = {SIGNATURE_HEADER: sign(b"", keys)}
    try:
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
            client.stream("GET", url, headers=headers) as response,
        ):
            body = await _read_capped(response)
    except httpx.HTTPError as exc:
        raise EndpointError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise _refusal(response.status_code, body)
    try:
        verify(response.headers.get(SIGNATURE_HEADER), body, keys)
    except SignatureError as exc:
        raise EndpointError(f"the endpoint's answer is not signed with this server's key: {exc}") from exc
    try:
        return AppDocument.from_json(json.loads(body))
    except (ValueError, AppDocumentError) as exc:
        raise EndpointError(f"the endpoint's answer is not an app document: {exc}") from exc


def function_configs(url: str, document: AppDocument) -> dict[str, str]:
    """Each function's description as the catalog stores it (with ``serve_url``),
    by id, after rebuilding it; ``EndpointError`` names a bad one."""
    configs: dict[str, str] = {}
    for description in document.functions:
        function_id = description["id"]
        if function_id in configs:
            raise EndpointError(f"the endpoint describes function {function_id!r} twice")
        try:
            rebuild(description)
        except (ConfigError, ExpressionError, KeyError, TypeError, ValueError) as exc:
            raise EndpointError(f"function {function_id!r} has an invalid description: {exc}") from exc
        configs[function_id] = json.dumps({**description, SERVE_URL: url}, sort_keys=True)
    return configs


# -- registering ----------------------------------------------------------------------------------
def served_from(config_json: str) -> str | None:
    """The URL a stored function description is served from (``None``: by workers)."""
    value = json.loads(config_json).get(SERVE_URL)
    return value if isinstance(value, str) else None


def conflicts(
    url: str,
    app: str,
    function_ids: Sequence[str],
    functions: Mapping[str, tuple[str, str]],
    retired: Mapping[str, float],
    apps: Sequence[AppRow],
) -> list[str]:
    """Why ``url`` may not register ``app`` with these functions: an id or the
    app's name owned by workers or another URL (retired functions own nothing)."""
    found = [
        f"app {app!r} is already served from {row.url}" for row in apps if row.app == app and row.url != url
    ]
    wanted = set(function_ids)
    for function_id, (owner, config) in sorted(functions.items()):
        if function_id in retired:
            continue
        source = served_from(config)
        if source == url:
            continue
        by = "served by workers" if source is None else f"served from {source}"
        if function_id in wanted:
            found.append(f"function {function_id!r} is already registered by app {owner!r} ({by})")
        elif owner == app and source is None:
            found.append(f"app name {app!r} is used by workers (function {function_id!r})")
    return found


def registration(
    url: str, document: AppDocument, configs: dict[str, str], now: float
) -> Callable[[Tx], AppRow]:
    """The one transaction that registers a fetched ``document`` served at ``url``."""

    def op(tx: Tx) -> AppRow:
        tx.lock(LOCK)  # two URLs racing for one id or name: the second sees the first's rows
        found = conflicts(
            url, document.app, list(configs), tx.load_functions(), tx.retired_functions(), tx.list_apps()
        )
        if found:
            raise InvalidStateError("; ".join(found))
        previous = tx.get_app(url)
        tx.register_functions(document.app, configs, now, retire_others=True)
        if not configs:
            tx.retire_app_functions(document.app, now)
        if previous is not None and previous.app != document.app:  # the endpoint renamed its app
            tx.retire_app_functions(previous.app, now)
        row = AppRow(
            url=url,
            app=document.app,
            app_version=document.app_version,
            max_duration=document.max_duration,
            function_ids=tuple(sorted(configs)),
            created_at=now if previous is None else previous.created_at,
            synced_at=now,
        )
        tx.upsert_app(row)
        return row

    return op


async def sync_app(store: Store, keys: SigningKeys | None, clock: Clock, url: str) -> AppRow:
    """Fetch the app served at ``url`` and register its functions (see the module
    docstring). ``ConfigError`` for a bad URL, ``InvalidStateError`` without a
    signing key or for an id another app owns, ``EndpointError`` for an
    endpoint that cannot be reached or answers wrongly."""
    url = check_url(url)
    if keys is None:
        raise InvalidStateError(
            "this server has no signing key: start it with --signing-key or $STEPSTONE_SIGNING_KEY"
        )
    try:
        document = await fetch_document(url, keys)
        configs = function_configs(url, document)
        row = await store.transact(registration(url, document, configs, clock.now()))
    except (EndpointError, InvalidStateError) as exc:
        await _note_failure(store, url, exc, clock.now())
        raise
    return row


async def _note_failure(store: Store, url: str, exc: StepstoneError, now: float) -> None:
    reason = clip(str(exc), MAX_ERROR_BYTES)

    def op(tx: AppsTx) -> bool:
        return tx.record_app_error(url, reason, now)

    await store.transact(op)


async def unregister_app(store: Store, clock: Clock, url: str) -> AppRow:
    """Forget the app served at ``url`` and retire its functions: events start
    no new runs of them; runs already started drain to ``url`` (``pusher.draining``).
    ``NotFoundError`` if ``url`` is not registered."""
    now = clock.now()

    def op(tx: Tx) -> AppRow:
        tx.lock(LOCK)
        row = tx.get_app(url)
        if row is None:
            raise NotFoundError(f"no app is registered at {url!r}")
        tx.retire_app_functions(row.app, now)
        tx.delete_app(url)
        return row

    return await store.transact(op)
