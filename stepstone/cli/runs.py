"""``stepstone runs``: list, show, export, cancel, replay, resume, rerun, signal, and the bulk actions."""

from __future__ import annotations

from typing import Any

import click

from stepstone.app import App
from stepstone.cli import render, views
from stepstone.cli.common import JsonObject, guard, open_target, parse_json, target_options
from stepstone.client import Client
from stepstone.inventory import require_function
from stepstone.runs import Run
from stepstone.server.params import check_range, parse_moment
from stepstone.store.rows import RUN_STATUSES, RunFilter, RunStatus

STATUSES = tuple(s.value for s in RUN_STATUSES)
TIME_HELP = "RFC 3339 date-time or epoch seconds"


@click.group()
def runs() -> None:
    """List, inspect, cancel, replay and resume runs."""


@runs.command("list")
@click.option("--function", "function_id", default=None)
@click.option("--status", type=click.Choice(STATUSES), multiple=True, help="Repeat for several.")
@click.option("--since", default=None, help=f"Created at or after: {TIME_HELP}.")
@click.option("--until", default=None, help=f"Created before: {TIME_HELP}.")
@click.option("--event", "event_id", default=None, help="Only runs this event (id) triggered.")
@click.option(
    "--if", "if_", default=None, help="CEL over the run's first event, e.g. \"event.data.plan == 'pro'\"."
)
@click.option("--limit", default=20, show_default=True)
@click.option("--app-version", default=None, help="Only runs last run by this version of the app.")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def runs_list(
    function_id: str | None,
    status: tuple[str, ...],
    since: str | None,
    until: str | None,
    event_id: str | None,
    if_: str | None,
    limit: int,
    app_version: str | None,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Runs, newest first."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            where = RunFilter(
                function_id=function_id,
                statuses=status,
                event_id=event_id,
                since=parse_moment(since, "since"),
                until=parse_moment(until, "until"),
                limit=limit,
                app_version=app_version,
            )
            found = _find(target, where, if_)
            if as_json:
                render.emit_json([render.run_json(r) for r in found])
            else:
                render.runs_table(found)

        guard(show)


def _find(target: App | Client, where: RunFilter, if_: str | None) -> list[Run]:
    if if_ is not None:
        return views.runs_where(target, where, if_, where.limit)
    return target.runs.list(
        function_id=where.function_id,
        event_id=where.event_id,
        status=list(where.statuses) or None,
        since=where.since,
        until=where.until,
        limit=where.limit,
    )


@runs.command("show")
@click.argument("run_id")
@click.option("--trace", is_flag=True, help="Also show every span (attempts, sleeps, warnings).")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def runs_show(
    run_id: str, trace: bool, database_url: str | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """A run with its steps (and its trace with --trace)."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            run = target.runs.get(run_id)
            spans = target.runs.trace(run_id) if trace else []
            if as_json:
                out = render.run_json(run)
                if trace:
                    out["trace"] = [render.span_json(s) for s in spans]
                render.emit_json(out)
                return
            render.run_details(run)
            if trace:
                render.spans_table(spans)

        guard(show)


@runs.command("export")
@click.argument("run_id")
@target_options
def runs_export(run_id: str, database_url: str | None, url: str | None, api_key: str | None) -> None:
    """Print a run's history as JSON, for stepstone check --history (docs/versioning.md)."""
    with open_target(database_url, url, api_key) as target:
        guard(lambda: render.emit_json(target.runs.export(run_id)))


@runs.command("cancel")
@click.argument("run_id")
@target_options
def runs_cancel(run_id: str, database_url: str | None, url: str | None, api_key: str | None) -> None:
    """Cancel a run; prints its status."""
    with open_target(database_url, url, api_key) as target:
        guard(lambda: click.echo(target.runs.cancel(run_id)))


@runs.command("replay")
@click.argument("run_id")
@target_options
def runs_replay(run_id: str, database_url: str | None, url: str | None, api_key: str | None) -> None:
    """Resume a failed or cancelled run from its last successful step."""
    _act("replay", "replaying", run_id, database_url, url, api_key)


@runs.command("resume")
@click.argument("run_id")
@target_options
def runs_resume(run_id: str, database_url: str | None, url: str | None, api_key: str | None) -> None:
    """Continue a paused run under the code deployed now."""
    _act("resume", "resuming", run_id, database_url, url, api_key)


def _act(
    action: str, doing: str, run_id: str, database_url: str | None, url: str | None, api_key: str | None
) -> None:
    """Replay or resume one run (``action`` names the ``runs`` method); prints ``doing RUN_ID``."""
    with open_target(database_url, url, api_key) as target:

        def act() -> None:
            getattr(target.runs, action)(run_id)
            click.echo(f"{doing} {run_id}")

        guard(act)


@runs.command("rerun")
@click.argument("run_id")
@click.argument("step_id")
@click.option(
    "--event-data", type=JsonObject(), default=None, help="Start the new run with this data (a JSON object)."
)
@target_options
def runs_rerun(
    run_id: str,
    step_id: str,
    event_data: dict[str, Any] | None,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Fork a new run keeping the steps before STEP_ID; prints the new run id."""
    with open_target(database_url, url, api_key) as target:
        guard(lambda: click.echo(target.runs.rerun_from(run_id, step_id, event_data)))


@runs.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.option("--data", default="null", show_default=True, help="The signal's data, as JSON.")
@target_options
def runs_signal(
    run_id: str, name: str, data: str, database_url: str | None, url: str | None, api_key: str | None
) -> None:
    """Send signal NAME to a run (its wait_for_signal receives it); prints the signal id."""
    payload = parse_json(data)
    with open_target(database_url, url, api_key) as target:
        guard(lambda: click.echo(target.runs.signal(run_id, name, payload)))


def _bulk_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--function", "function_id", required=True),
            click.option("--since", default=None, help=f"Created at or after: {TIME_HELP}."),
            click.option("--until", default=None, help=f"Created before: {TIME_HELP}."),
            click.option("--if", "if_", default=None, help="CEL condition over the run's `event`."),
        ]
    ):
        fn = option(fn)
    return target_options(click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn))


def _bulk(
    action: str,
    target: App | Client,
    function_id: str,
    since: str | None,
    until: str | None,
    if_: str | None,
    as_json: bool,
    **extra: Any,
) -> None:
    lo, hi = parse_moment(since, "since"), parse_moment(until, "until")
    check_range(lo, hi)
    if isinstance(target, App):
        target.store.read_sync(lambda tx: require_function(tx, function_id))
    methods = {
        "cancel": target.runs.cancel_many,
        "replay": target.runs.replay_many,
        "resume": target.runs.resume_many,
    }
    method = methods[action]
    with render.bulk_progress(f"{action} {function_id}", quiet=as_json) as progress:
        count = method(function_id=function_id, since=lo, until=hi, if_=if_, progress=progress, **extra)
    if as_json:
        render.emit_json({"action": action, "function_id": function_id, "count": count})
    else:
        click.echo(f"{action}: {count} run(s)")


@runs.command("cancel-many")
@_bulk_options
def runs_cancel_many(
    function_id: str,
    since: str | None,
    until: str | None,
    if_: str | None,
    as_json: bool,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Cancel a function's active runs (optionally in a time range, matching --if)."""
    with open_target(database_url, url, api_key) as target:
        guard(lambda: _bulk("cancel", target, function_id, since, until, if_, as_json))


@runs.command("resume-many")
@_bulk_options
def runs_resume_many(
    function_id: str,
    since: str | None,
    until: str | None,
    if_: str | None,
    as_json: bool,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Resume a function's paused runs under the code deployed now."""
    with open_target(database_url, url, api_key) as target:
        guard(lambda: _bulk("resume", target, function_id, since, until, if_, as_json))


@runs.command("replay-many")
@_bulk_options
@click.option(
    "--status",
    type=click.Choice([RunStatus.FAILED.value, RunStatus.CANCELLED.value]),
    multiple=True,
    help="Default: failed. Repeat for both.",
)
def runs_replay_many(
    function_id: str,
    since: str | None,
    until: str | None,
    if_: str | None,
    as_json: bool,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
    status: tuple[str, ...],
) -> None:
    """Replay a function's failed (or cancelled) runs."""
    with open_target(database_url, url, api_key) as target:
        guard(
            lambda: _bulk(
                "replay",
                target,
                function_id,
                since,
                until,
                if_,
                as_json,
                status=list(status) or RunStatus.FAILED,
            )
        )
