"""``stepstone stats`` and ``stepstone prune`` as an operator runs them, on both stores."""

from __future__ import annotations

import json
from collections.abc import Callable

import stepstone as ss
from tests.acceptance.test_cli import cli
from tests.conftest import query, send_and_wait
from tests.polling import wait_for


def test_stats_shows_rows_bytes_and_the_oldest_ended_run(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app()
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: "x" * 2000))
    app.start()
    first = send_and_wait(app, ss.Event("go"))
    send_and_wait(app, ss.Event("go"))
    found = json.loads(cli(db_url, "stats", "--json").stdout)
    tables = {t["name"]: t for t in found["tables"]}
    assert tables["runs"]["rows"] == 2 and tables["steps"]["rows"] == 2
    assert tables["steps"]["bytes"] >= 4000 and found["total_bytes"] >= tables["steps"]["bytes"]
    assert found["oldest_ended"]["id"] == first.id
    table = cli(db_url, "stats").stdout
    assert "steps" in table and "KiB" in table and f"oldest ended run: {first.id} (completed" in table


def test_prune_dry_run_then_prune_keeps_live_runs(make_app: Callable[..., ss.App], db_url: str) -> None:
    app = make_app(retention=None)  # the workers keep everything: only the command deletes
    app.function(id="f", trigger=ss.on_event("go"))(lambda ctx: ctx.step.run("s", lambda: 1))
    app.function(id="nap", trigger=ss.on_event("nap"))(lambda ctx: ctx.step.sleep("z", "1h"))
    app.start()
    ended = [send_and_wait(app, ss.Event("go")) for _ in range(3)]
    [nap_event] = app.send(ss.Event("nap"))
    wait_for(lambda: app.runs.list(event_id=nap_event)[0].status == "sleeping", 10, "the nap sleeps")

    dry = cli(db_url, "prune", "--older-than", "1ms", "--dry-run")
    assert "would delete 3 run(s)" in dry.stdout
    for table in ("events", "jobs", "crons", "functions", "batches", "debounces", "dedupe", "gcra"):
        assert f"  {table}: " in dry.stdout, dry.stdout  # every table it prunes, counted now
    assert len(app.runs.list()) == 4
    done = cli(db_url, "prune", "--older-than", "1ms", "--batch", "2")
    assert "deleted" in done.stdout and "3 runs" in done.stdout and "3 steps" in done.stdout
    assert "3/3" in done.stderr  # the progress bar
    [left] = app.runs.list()
    assert left.function_id == "nap" and left.status == "sleeping"
    assert all(query(db_url, f"SELECT COUNT(*) FROM steps WHERE run_id = '{r.id}'")[0][0] == 0 for r in ended)
    bad = cli(db_url, "prune", "--older-than", "soon", ok=False)
    assert "--older-than" in bad.stderr and bad.returncode == 2
