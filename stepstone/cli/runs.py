"""``stepstone runs list|show|cancel|replay|rerun|cancel-many|replay-many``."""

from __future__ import annotations

from typing import Any

import click

from stepstone.app import App
from stepstone.cli import render
from stepstone.cli.common import JsonObject, guard, open_target, target_options
from stepstone.client import Client
from stepstone.inventory import require_function
from stepstone.server.params import check_range, parse_moment
from stepstone.store.rows import RUN_STATUSES, RunStatus

STATUSES = tuple(s.value for s in RUN_STATUSES)
TIME_HELP = "RFC 3339 date-time or epoch seconds"


@click.group()
def runs() -> None:
    """List, inspect, cancel and replay runs."""


@runs.command("list")
@click.option("--function", "function_id", default=None)
@click.option("--status", type=click.Choice(STATUSES), multiple=True, help="Repeat for several.")
@click.option("--since", default=None, help=f"Created at or after: {TIME_HELP}.")
@click.option("--until", default=None, help=f"Created before: {TIME_HELP}.")
@click.option("--limit", default=20, show_default=True)
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def runs_list(
    function_id: str | None,
    status: tuple[str, ...],
    since: str | None,
    until: str | None,
    limit: int,
    database_url: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Runs, newest first."""
    with open_target(database_url, url, api_key) as target:

        def show() -> None:
            found = target.runs.list(
                function_id=function_id,
                status=list(status) or None,
                since=parse_moment(since, "since"),
                until=parse_moment(until, "until"),
                limit=limit,
            )
            if as_json:
                render.emit_json([render.run_json(r) for r in found])
            else:
                render.runs_table(found)

        guard(show)


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
    with open_target(database_url, url, api_key) as target:

        def replay() -> None:
            target.runs.replay(run_id)
            click.echo(f"replaying {run_id}")

        guard(replay)


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
    method = target.runs.cancel_many if action == "cancel" else target.runs.replay_many
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
