"""``stepstone server`` (the HTTP API over a database, no user code) and
``stepstone dev`` (the user's app, in-process workers and the HTTP API in one
process, reloading on code change)."""

from __future__ import annotations

import os
import secrets
import sys
from typing import Any

import click

from stepstone.app import App
from stepstone.cli.common import console, errors, load_app, resolve_url
from stepstone.cli.ports import check_port
from stepstone.errors import ConfigError

DEV_PORT = 8288


def _serve(api: Any, host: str, port: int, access_log: bool = True) -> None:
    import uvicorn

    level = str(click.get_current_context().find_root().params.get("log_level", "INFO")).lower()
    uvicorn.run(api, host=host, port=port, log_level=level, access_log=access_log, lifespan="on")


@click.command()
@click.option(
    "--database-url", default=None, help="Default: $STEPSTONE_DATABASE_URL or the local SQLite file."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEV_PORT, show_default=True)
@click.option("--api-key", default=None, help="Default: $STEPSTONE_API_KEY (comma-separated for rotation).")
@click.option("--event-key", default=None, help="May only send events. Default: $STEPSTONE_EVENT_KEY.")
@click.option("--insecure-no-auth", is_flag=True, help="Serve without keys (never on a shared network).")
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="Log every request.")
@click.option(
    "--signing-key",
    default=None,
    help="Signs requests to apps served over HTTP (ss.serve). Default: $STEPSTONE_SIGNING_KEY.",
)
@click.option(
    "--signing-key-fallback",
    default=None,
    help="Also accepted while keys rotate. Default: $STEPSTONE_SIGNING_KEY_FALLBACK.",
)
@click.option(
    "--push-concurrency",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Invocation requests open at once to each app served over HTTP.",
)
@click.option(
    "--push-timeout",
    default=90.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Seconds an app served over HTTP may take to answer (above its max_duration).",
)
@click.option(
    "--push-lease-ttl",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Seconds a pushed run's lease outlives a server that died (another server, or this one "
    "restarted, resumes it then).",
)
def server(
    database_url: str | None,
    host: str,
    port: int,
    api_key: str | None,
    event_key: str | None,
    insecure_no_auth: bool,
    access_log: bool,
    signing_key: str | None,
    signing_key_fallback: str | None,
    push_concurrency: int,
    push_timeout: float,
    push_lease_ttl: float,
) -> None:
    """Serve the HTTP API over a database; no user code needed. With a signing
    key, also execute the runs of apps served over HTTP (ss.serve)."""
    from stepstone.pusher import PushSettings
    from stepstone.server.auth import AuthConfig
    from stepstone.server.factory import create_app
    from stepstone.signing import SigningKeys

    try:
        auth = AuthConfig.resolve(api_key, event_key, insecure=insecure_no_auth)
        signing = SigningKeys.from_env(signing_key, signing_key_fallback)
    except ConfigError as exc:
        raise click.UsageError(f"refusing to start: {exc}") from exc
    if auth.open:
        errors.print("[bold red]WARNING[/]: serving without authentication (--insecure-no-auth)")
    check_port(host, port)
    app = App("stepstone-server", database_url=resolve_url(database_url))
    try:
        app.store  # noqa: B018 - open and migrate now: fail fast on a bad database
        console.print(
            f"Stepstone API and dashboard on http://{host}:{port} over {app.database_url}", highlight=False
        )
        push = PushSettings(concurrency=push_concurrency, timeout=push_timeout, lease_ttl=push_lease_ttl)
        _serve(create_app(app, auth, signing=signing, push=push), host, port, access_log)
    finally:
        app.close()


@click.command()
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEV_PORT, show_default=True)
@click.option("--concurrency", default=10, show_default=True, help="Runs executed at once.")
@click.option("--api-key", default=None, help="Default: $STEPSTONE_API_KEY, else a generated key.")
@click.option("--event-key", default=None, help="Default: $STEPSTONE_EVENT_KEY.")
@click.option(
    "--reload/--no-reload",
    default=True,
    show_default=True,
    help="Restart when a Python file under the app's directory changes.",
)
def dev(
    target: str,
    host: str,
    port: int,
    concurrency: int,
    api_key: str | None,
    event_key: str | None,
    reload: bool,
) -> None:
    """Run MODULE:app for development: workers and the HTTP API in one process."""
    from stepstone.server.auth import API_KEY_ENV, EVENT_KEY_ENV

    check_port(host, port)
    key = api_key or os.environ.get(API_KEY_ENV)
    if not key:
        key = secrets.token_urlsafe(24)
        _banner(host, port, key)
    env = {API_KEY_ENV: key, **({EVENT_KEY_ENV: event_key} if event_key else {})}
    if not reload:
        os.environ.update(env)
        _serve_dev(target, host, port, concurrency)
        return
    from stepstone.cli.reload import Supervisor, watch_root

    level = click.get_current_context().find_root().params.get("log_level", "INFO")
    argv = [
        sys.executable,
        "-m",
        "stepstone.cli",
        "--log-level",
        level,
        "dev",
        target,
        "--no-reload",
        "--host",
        host,
        "--port",
        str(port),
        "--concurrency",
        str(concurrency),
    ]
    sys.exit(Supervisor(argv, env, watch_root(target)).run())


def _banner(host: str, port: int, key: str) -> None:
    url = f"http://{host}:{port}"
    click.echo(
        f"Stepstone dev on {url} (dashboard: {url}/, API docs: {url}/docs)\n"
        f"API key (generated): {key}\n"
        f"  export STEPSTONE_URL={url} STEPSTONE_API_KEY={key}",
        nl=True,
    )


def _serve_dev(target: str, host: str, port: int, concurrency: int) -> None:
    from stepstone.server.auth import AuthConfig
    from stepstone.server.factory import WorkerSettings, create_app

    app = load_app(target)
    try:
        api = create_app(app, AuthConfig.resolve(), workers=WorkerSettings(concurrency=concurrency))
        console.print(
            f"{app.name}: {len(app.registry.ids())} function(s) on {app.database_url}, "
            f"API on http://{host}:{port}",
            highlight=False,
        )
        _serve(api, host, port)
    finally:
        app.close()
