"""The CLI as a new user meets it (issue 20): ids are never cut, even in a
narrow terminal, so an id pasted from ``runs list`` opens the run; ``events
list``, ``queue`` and ``runs list --event/--if`` read the same from the
database and from a server; talking to a server prints no httpx log lines.
Real ``stepstone`` processes over a real SQLite file and a live HTTP server."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import stepstone as ss
from tests.acceptance.test_http_cli import STEPSTONE, env
from tests.server.conftest import API_KEY, Live, serve  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
NARROW = "48"  # columns: far narrower than a row of full ids


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[tuple[str, ss.App]]:
    """Two functions nobody works on (their runs stay queued): ``parked`` with a
    concurrency key, so the queue has a backlog per key."""
    url = f"sqlite:///{tmp_path}/shop.db"
    app = ss.App("shop", database_url=url)
    per_tenant = ss.Concurrency(limit=2, key="event.data.tenant")
    app.function(id="parked", trigger=ss.on_event("park"), concurrency=per_tenant)(lambda ctx: None)
    app.function(id="noted", trigger=ss.on_event("note"))(lambda ctx: None)
    app.send([ss.Event("park", {"tenant": "acme", "plan": "pro"}, id=f"acme-{i}") for i in range(3)])
    app.send(ss.Event("park", {"tenant": "globex", "plan": "free"}, id="globex-0"))
    app.send(ss.Event("note", {}, id="a-note-with-a-rather-long-event-id-0123456789"))
    yield url, app
    app.close()


@pytest.fixture(params=["database", "server"])
def target(
    request: pytest.FixtureRequest,
    shop: tuple[str, ss.App],
    serve: Callable[..., Live],  # noqa: F811
) -> dict[str, str]:
    """The environment that points the CLI at the database, or at a server over it."""
    url, app = shop
    if request.param == "database":
        return {"STEPSTONE_DATABASE_URL": url}
    live = serve(app)
    return {"STEPSTONE_URL": live.url, "STEPSTONE_API_KEY": API_KEY}


def cli(target: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [STEPSTONE, *args], capture_output=True, text=True, timeout=60, env=env(COLUMNS=NARROW, **target)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "httpx" not in result.stderr and "HTTP Request" not in result.stderr, result.stderr
    return result


def first_column(table: str) -> list[str]:
    """The cells of a rich table's first column (not its header), as a user would select them."""
    cells = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")]
    return [cell for cell in cells if cell]


def test_an_id_pasted_from_runs_list_opens_the_run(shop: tuple[str, ss.App], target: dict[str, str]) -> None:
    _, app = shop
    pasted = first_column(cli(target, "runs", "list").stdout)
    assert pasted == [r.id for r in app.runs.list()]  # whole ids, newest first
    shown = cli(target, "runs", "show", pasted[-1]).stdout
    assert pasted[-1] in shown.replace("\n", "") and "queued" in shown
    events = first_column(cli(target, "events", "list").stdout)
    assert "a-note-with-a-rather-long-event-id-0123456789" in events


def test_events_list_queue_and_runs_filters(shop: tuple[str, ss.App], target: dict[str, str]) -> None:
    _, app = shop
    [acme_run] = app.runs.list(event_id="acme-1")
    only = cli(target, "events", "list", "--name", "park", "--limit", "2", "--json").stdout
    assert '"id": "globex-0"' in only and '"id": "acme-2"' in only and "acme-1" not in only
    with_runs = cli(target, "events", "list", "--id", "acme-1", "--json").stdout
    assert acme_run.id in with_runs and '"function_id": "parked"' in with_runs

    assert first_column(cli(target, "runs", "list", "--event", "acme-1").stdout) == [acme_run.id]
    pro = first_column(cli(target, "runs", "list", "--if", "event.data.plan == 'pro'").stdout)
    assert pro == [r.id for r in app.runs.list(function_id="parked")][1:]  # the three acme runs

    queue = cli(target, "queue").stdout.replace("\n", " ")
    rows = [line for line in cli(target, "queue", "--json").stdout.splitlines() if '"total"' in line]
    assert "parked" in queue and "noted" in queue
    assert len(rows) == 3  # parked: acme and globex; noted: no key
    backlog = {k["ckey1"]: k["due"] for k in _keys(cli(target, "queue", "--json").stdout, "parked")}
    assert backlog == {'fn:parked:"acme"': 3, 'fn:parked:"globex"': 1}  # as the API shows keys


def _keys(text: str, function_id: str) -> list[dict[str, object]]:
    import json

    [load] = [f for f in json.loads(text) if f["function_id"] == function_id]
    keys: list[dict[str, object]] = load["keys"]
    return keys
