"""``stepstone stats`` and ``stepstone prune`` as an operator runs them, on both stores."""

from __future__ import annotations

import json
from collections.abc import Callable

import stepstone as ss
from tests.acceptance.test_cli import cli
from tests.conftest import send_and_wait


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
