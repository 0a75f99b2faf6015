"""What commands share: loading ``MODULE:app``, the database URL, error
handling, and the *target* a command acts on: the database directly
(``--database-url``) or a Stepstone server (``--url`` + ``--api-key``)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
from rich.console import Console

from stepstone.app import DEFAULT_DATABASE_URL, App
from stepstone.client import Client
from stepstone.errors import StepstoneError

console = Console()
errors = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def redacted(url: str) -> str:
    """A database URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def load_app(target: str) -> App:
    """Import ``MODULE:attr`` (the current directory is importable)."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise click.BadParameter(f"expected MODULE:app, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{target!r} is not a stepstone.App")
    return app


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("STEPSTONE_DATABASE_URL") or DEFAULT_DATABASE_URL


def parse_json(text: str, option: str = "--data") -> Any:
    """An option's JSON value; invalid JSON is a usage error naming the option."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{option} is not JSON: {exc}") from exc


class JsonObject(click.ParamType[dict[str, Any]]):
    """An option whose value is a JSON object (``'{"a": 1}'``), parsed into a dict."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"not JSON: {exc}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail("must be a JSON object", param, ctx)
        return parsed


def guard(action: Callable[[], Any]) -> None:
    """Run ``action``; a Stepstone error becomes a clean CLI error (exit 1)."""
    try:
        action()
    except StepstoneError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc


def target_options(fn: F) -> F:
    """``--database-url`` (act on the database) or ``--url``/``--api-key`` (a server)."""
    for option in reversed(
        [
            click.option(
                "--database-url",
                default=None,
                help="Default: $STEPSTONE_DATABASE_URL or the local SQLite file.",
            ),
            click.option(
                "--url",
                envvar="STEPSTONE_URL",
                default=None,
                help="A Stepstone server instead of the database ($STEPSTONE_URL).",
            ),
            click.option(
                "--api-key",
                envvar="STEPSTONE_API_KEY",
                default=None,
                help="The server's API key ($STEPSTONE_API_KEY).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


@contextlib.contextmanager
def open_target(
    database_url: str | None, url: str | None, api_key: str | None, event_key: str | None = None
) -> Iterator[App | Client]:
    """An ``App`` on the database, or a ``Client`` when ``url`` is given."""
    target: App | Client
    if url:
        target = Client(url, api_key=api_key, event_key=event_key)
    else:
        target = App("cli", database_url=resolve_url(database_url))
    try:
        yield target
    finally:
        target.close()
