"""``stepstone check MODULE:app``: will the code loaded now fit the live runs?

A deploy gate: exit 0 when every in-flight run (or ``--history`` file) replays
onto this code, 1 when one diverges, 2 on a usage error (click's own code).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import click
from rich.table import Table

from stepstone.checking import CheckReport
from stepstone.cli import render
from stepstone.cli.common import console, load_app
from stepstone.errors import ConfigError, StepstoneError


@click.command()
@click.argument("target")
@click.option("--function", "function_id", default=None, help="Check only this function's runs.")
@click.option(
    "--history",
    "history_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
    help="An exported history (stepstone runs export) to check instead of the database; repeat.",
)
@click.option("--database-url", default=None, help="Default: the app's own database URL.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(
    target: str,
    function_id: str | None,
    history_files: tuple[pathlib.Path, ...],
    database_url: str | None,
    as_json: bool,
) -> None:
    """Replay in-flight runs against MODULE:app's code; exit 1 if any diverges."""
    app = load_app(target)
    if database_url:
        app.database_url = database_url
    histories = [_read(path) for path in history_files] if history_files else None
    try:
        report = app.check(function_id=function_id, histories=histories)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    except StepstoneError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    finally:
        app.close()
    if as_json:
        render.emit_json(report.to_json())
    else:
        _table(report)
    if not report.ok:
        raise SystemExit(1)


def _read(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--history") from exc


def _table(report: CheckReport) -> None:
    table = Table("function", "runs checked", "diverging")
    for function_id, count in sorted(report.functions.items()):
        diverging = sum(1 for d in report.incompatible if d.function_id == function_id)
        table.add_row(function_id, str(count), f"[red]{diverging}[/red]" if diverging else "0")
    console.print(table)
    if report.incompatible:
        details = Table("run", "function", "reason", "step reached", "recorded steps never reached")
        for d in report.incompatible:
            details.add_row(d.run_id, d.function_id, str(d.reason), d.step_id or "", ", ".join(d.missing))
        console.print(details)
        for d in report.incompatible:
            console.print(f"{d.run_id}: {d.message}", markup=False, highlight=False)
    verdict = "[green]ok[/green]" if report.ok else f"[red]{len(report.incompatible)} diverging[/red]"
    console.print(f"{report.runs_checked} run(s) checked: {verdict}")
