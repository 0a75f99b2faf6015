"""The chaos suite (issue 12): `stepstone worker` processes drain multi-step runs
whose steps write a side-effect ledger, while the harness SIGKILLs workers,
SIGSTOPs them past their lease, restarts PostgreSQL, and (mix) an operator
cancels and replays runs. Prints, per scenario and backend, what a careful buyer
asks: runs lost, completed steps executed again, re-executions a fault explains.

    .venv/bin/python bench/chaos.py                                  # every scenario, both backends
    .venv/bin/python bench/chaos.py --backend sqlite --scenario storm --runs 50
    .venv/bin/python bench/chaos.py --json > figures.json            # machine-readable
    .venv/bin/python bench/chaos.py --markdown figures.json          # the table of docs/reliability.md

Exits 1 when a run was lost (not ended by the deadline), a completed step ran
again with no fault to explain it, or a cancelled run started a second step. PostgreSQL
runs on a private cluster with its durable defaults (fsync and synchronous_commit
on); SQLite on a file with the default ``synchronous=full``. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.acceptance.chaos import SCENARIOS, Config, Outcome, run_scenario  # noqa: E402
from tests.pgcluster import PgCluster  # noqa: E402

COLUMNS = [
    ("scenario", "scenario"),
    ("backend", "backend"),
    ("runs_sent", "runs"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
    ("lost_or_stuck", "**lost / stuck**"),
    ("faults", "faults"),
    ("step_executions", "step executions"),
    ("retried_attempts", "injected failures"),
    ("re_executed", "re-executed at a fault (kill / pause / restart)"),
    ("re_executed_unexplained", "re-executed, no fault"),
    ("completed_steps_rerun", "**completed steps re-run** (by a resumed worker / at a restart)"),
    ("cancels_not_honoured", "**cancels not honoured**"),
    ("wall_seconds", "wall s"),
    ("steps_per_second", "steps/s"),
]


@contextlib.contextmanager
def postgres() -> Iterator[PgCluster]:
    cluster = PgCluster.start_new(settings={})  # PostgreSQL's durable defaults
    try:
        yield cluster
    finally:
        cluster.stop()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    config = Config(
        runs=args.runs,
        workers=args.workers,
        concurrency=args.concurrency,
        lease_ttl=args.lease_ttl,
        fault_seconds=args.seconds,
        deadline=args.seconds + args.grace,
        seed=args.seed,
        kill_every=args.kill_every,
    )
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    scenarios = list(SCENARIOS) if args.scenario == "all" else args.scenario.split(",")
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepstone-chaos-") as tmp:
        workdir = Path(args.keep or tmp)
        for backend in backends:
            for number, scenario in enumerate(scenarios):
                if scenario == "restart" and backend == "sqlite":
                    continue  # no server to restart
                outcome = _one(scenario, backend, workdir, config, number)
                figures.append(outcome.figures() | {"config": dataclasses.asdict(config)})
                print(summary(figures[-1]), file=sys.stderr, flush=True)
                if figures[-1]["violations"]:
                    print(outcome.log[-3000:], file=sys.stderr)
    return figures


def _one(scenario: str, backend: str, workdir: Path, config: Config, number: int) -> Outcome:
    if backend == "sqlite":
        url = f"sqlite:///{workdir}/{scenario}.db"
        with contextlib.suppress(FileNotFoundError):
            for suffix in ("", "-wal", "-shm"):
                os.unlink(f"{workdir}/{scenario}.db{suffix}")
        return run_scenario(scenario, backend, url, workdir, config)
    with postgres() as cluster:  # a cluster per scenario: a restart disturbs nothing else
        url = cluster.create_database(f"chaos_{number}")
        return run_scenario(scenario, backend, url, workdir, config, cluster)


def summary(f: dict[str, Any]) -> str:
    line = (
        f"{f['scenario']:8} {f['backend']:8} runs {f['runs_sent']}: {f['completed']} completed, "
        f"{f['failed']} failed, {f['cancelled']} cancelled, {f['lost_or_stuck']} LOST/STUCK | "
        f"{_faults(f)} | {f['step_executions']} executions, {f['retried_attempts']} injected failures, "
        f"re-executed at kill/pause/restart {f['re_executed_at_kill']}/{f['re_executed_at_pause']}/"
        f"{f['re_executed_at_restart']}, no fault {f['re_executed_unexplained']} | completed steps re-run "
        f"{f['completed_steps_rerun']} (by a resumed worker {f['completed_steps_rerun_at_pause']}, at a restart "
        f"{f['completed_steps_rerun_at_restart']}, unexplained {f['completed_steps_rerun_unexplained']}) | "
        f"cancels not honoured {f['cancels_not_honoured']} | "
        f"{f['wall_seconds']} s, {f['steps_per_second']} steps/s"
    )
    return line + "".join(f"\n    VIOLATION {v}" for v in f["violations"][:20])


def _faults(f: dict[str, Any]) -> str:
    hijacks = f.get("hijacks", 0)
    cancels = f"{f['cancels']} cancels" + (f" ({hijacks} of a paused worker's runs)" if hijacks else "")
    parts = [
        (f["kills"], "kills"),
        (f["pauses"], "pauses"),
        (f["restarts"], "restarts"),
        (f["cancels"], cancels),
        (f["replays"], "replays"),
    ]
    return ", ".join(what if what == cancels else f"{n} {what}" for n, what in parts if n) or "no faults"


def markdown(figures: list[dict[str, Any]]) -> str:
    rows = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for f in figures:
        cells = dict(
            f,
            faults=_faults(f),
            re_executed=f"{f['re_executed_at_kill']} / {f['re_executed_at_pause']} / "
            f"{f['re_executed_at_restart']}",
            completed_steps_rerun=f"**{f['completed_steps_rerun']}** "
            f"({f['completed_steps_rerun_at_pause']} / "
            f"{f['completed_steps_rerun_at_restart']})",
            lost_or_stuck=f"**{f['lost_or_stuck']}**",
            cancels_not_honoured=f"**{f['cancels_not_honoured']}**" if f["cancels"] else "-",
        )
        rows.append("| " + " | ".join(str(cells[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(rows)


def describe() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return f"commit {commit}, python {platform.python_version()}, cpus {os.cpu_count()}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--scenario", default="all", help=f"all, or a comma-separated list of {SCENARIOS}")
    parser.add_argument("--runs", type=int, default=300, help="runs per scenario")
    parser.add_argument("--seconds", type=float, default=60, help="faults stop after this many seconds")
    parser.add_argument("--grace", type=float, default=120, help="then runs have this long to end")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="per worker process")
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--kill-every", type=float, default=0.7, help="mean seconds between SIGKILLs")
    parser.add_argument(
        "--keep", default=None, help="keep databases, ledgers and worker logs in this directory"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--markdown",
        metavar="FIGURES_JSON",
        default=None,
        help="print the table for docs/reliability.md from a --json file, and run nothing",
    )
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())["figures"]))
        return 0
    unknown = set(args.scenario.split(",")) - {*SCENARIOS, "all"}
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}: choose from {SCENARIOS}")
    print(describe(), file=sys.stderr)
    figures = run(args)
    if args.json:
        print(json.dumps({"environment": describe(), "figures": figures}, indent=1))
    else:
        print(markdown(figures))
    return 1 if any(f["violations"] for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
