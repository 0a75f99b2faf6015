"""``stepstone apps``: register apps served over HTTP (``ss.serve``) with a
Stepstone server, list them, unregister one. These act through the server's
API (``--url``, ``$STEPSTONE_API_KEY``): only the server holds the signing key
that its requests to the endpoints need."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from stepstone.cli import render
from stepstone.cli.common import guard
from stepstone.client import Client

F = TypeVar("F", bound=Callable[..., Any])


def _server_options(fn: F) -> F:
    fn = click.option(
        "--api-key",
        envvar="STEPSTONE_API_KEY",
        default=None,
        help="The server's API key ($STEPSTONE_API_KEY).",
    )(fn)
    return click.option(
        "--url",
        envvar="STEPSTONE_URL",
        required=True,
        help="The Stepstone server ($STEPSTONE_URL).",
    )(fn)


@click.group()
def apps() -> None:
    """Apps served over HTTP, registered by URL with a Stepstone server."""


@apps.command("sync")
@click.argument("endpoint")
@_server_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def apps_sync(endpoint: str, url: str, api_key: str | None, as_json: bool) -> None:
    """Register the app served at ENDPOINT, or pick up its changes."""
    with Client(url, api_key=api_key) as client:

        def run() -> None:
            row = client.apps.sync(endpoint)
            if as_json:
                render.emit_json(render.apps_json([row])[0])
            else:
                click.echo(f"synced {row.app} at {row.url}: {len(row.function_ids)} function(s)")
                render.apps_table([row])

        guard(run)


@apps.command("list")
@_server_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def apps_list(url: str, api_key: str | None, as_json: bool) -> None:
    """Registered apps, their functions, last sync and last error."""
    with Client(url, api_key=api_key) as client:

        def show() -> None:
            found = client.apps.list()
            if as_json:
                render.emit_json(render.apps_json(found))
            else:
                render.apps_table(found)

        guard(show)


@apps.command("unregister")
@click.argument("endpoint")
@_server_options
def apps_unregister(endpoint: str, url: str, api_key: str | None) -> None:
    """Forget the app served at ENDPOINT and retire its functions."""
    with Client(url, api_key=api_key) as client:

        def run() -> None:
            row = client.apps.unregister(endpoint)
            click.echo(f"unregistered {row.app} at {row.url}: {len(row.function_ids)} function(s) retired")

        guard(run)
