"""Attempt numbers (issue 20): a step's attempts are numbered from 1, the same in
the API, the CLI and the dashboard (``ctx.attempt + 1``), and the numbers of the
attempts before a replay stay in the trace after it; the replay's own attempts
count from 1 again, as the step's ``attempts`` and ``ctx.attempt`` do."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner

import stepstone as ss
from stepstone.cli.main import main
from tests.conftest import FAST
from tests.dashboard.conftest import sign_in
from tests.server.conftest import API_KEY, Live

Attempts = list[tuple[str, int]]


def step_spans(trace: list[dict[str, Any]], name: str) -> Attempts:
    return [(s["status"], s["attempt"]) for s in trace if s["kind"] == "step" and s["name"] == name]


def cli_trace(live: Live, run_id: str) -> list[dict[str, Any]]:
    args = ["runs", "show", run_id, "--trace", "--json", "--url", live.url, "--api-key", API_KEY]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    trace: list[dict[str, Any]] = json.loads(result.output)["trace"]
    return trace


def dashboard_attempts(live: Live, run_id: str) -> Attempts:
    client = sign_in(live.url)
    page = client.get(f"/runs/{run_id}").text
    client.close()
    shown = []
    for block in re.findall(r'data-span="step:wobble:\d+".*?</details>', page, re.S):
        status = re.search(r'<span class="sr">(\w+)</span>', block)
        number = re.search(r"<dt>Attempt</dt><dd>(\d+)</dd>", block)
        assert status and number, block
        shown.append((status.group(1), int(number.group(1))))
    return shown


def test_attempts_count_from_one_everywhere_and_survive_a_replay(
    make_app: Callable[..., ss.App], serve: Callable[..., Live]
) -> None:
    app = make_app("attempts")
    broken = {"now": True}
    seen: list[int] = []

    def wobble(attempt: int) -> str:
        seen.append(attempt)
        if broken["now"]:
            raise RuntimeError("still broken")
        return "fixed"

    @app.function(id="wobbly", trigger=ss.on_event("wobble"), retries=1, backoff=FAST)
    async def handler(ctx: ss.Context) -> str:
        return str(await ctx.step.run("wobble", lambda: wobble(ctx.attempt)))

    live = serve(app, workers=True)
    [event_id] = app.send(ss.Event("wobble", {}))
    run_id = app.runs.list(event_id=event_id)[0].id
    assert app.runs.wait(run_id, timeout="10s").status == "failed"
    before = [("retrying", 1), ("failed", 2)]
    api = live.http.get(f"/api/v1/runs/{run_id}/trace").json()["spans"]
    assert step_spans(api, "wobble") == before
    assert step_spans(cli_trace(live, run_id), "wobble") == before
    assert dashboard_attempts(live, run_id) == before
    assert live.http.get(f"/api/v1/runs/{run_id}").json()["steps"][0]["attempts"] == 2

    broken["now"] = False
    app.runs.replay(run_id)
    assert app.runs.wait(run_id, timeout="10s").status == "completed"
    after = [*before, ("completed", 1)]
    api = live.http.get(f"/api/v1/runs/{run_id}/trace").json()["spans"]
    assert step_spans(api, "wobble") == after
    assert step_spans(cli_trace(live, run_id), "wobble") == after
    assert dashboard_attempts(live, run_id) == after
    assert live.http.get(f"/api/v1/runs/{run_id}").json()["steps"][0]["attempts"] == 1
    assert seen == [0, 1, 0]  # ctx.attempt is the attempt number minus one
