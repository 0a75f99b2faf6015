"""The push model with real processes: a `stepstone server` process executing
the runs of an app served by a uvicorn process (``ss.serve``, no database
URL) or by a WSGI server (``ss.serve_wsgi``), over real HTTP, on SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import stepstone as ss
from stepstone.signing import SIGNATURE_HEADER, SigningKeys, sign
from stepstone.store.rows import EventRow, LeasedRun, RunRow, RunStatus
from stepstone.wire import encode_request
from tests.pushing import fetch_document, register_served
from tests.server.conftest import free_port

from .procs import create_ledger, ledger, wait_for

HERE = Path(__file__).parent
STEPSTONE = str(Path(sys.executable).parent / "stepstone")
OLD, NEW = "old-signing-key-" + "o" * 16, "new-signing-key-" + "n" * 16
pytestmark = pytest.mark.slow


class Procs:
    """The test's processes: an endpoint and a server, each restartable."""

    def __init__(self, tmp_path: Path) -> None:
        self.db_url = f"sqlite:///{tmp_path}/server.db"
        self.ledger = str(tmp_path / "ledger.db")
        create_ledger(self.ledger)
        self.env = {
            **os.environ,
            "LEDGER_PATH": self.ledger,
            "PYTHONPATH": os.pathsep.join((str(HERE), str(HERE.parents[1]))),
        }
        self.env.pop("STEPSTONE_DATABASE_URL", None)
        self.log = (tmp_path / "procs.log").open("ab")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.endpoint_port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.endpoint_port}/"
        self.client = ss.App("client", database_url=self.db_url)
        self.endpoint: subprocess.Popen[bytes] | None = None
        self.server: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, env={**self.env, **env}, stdout=self.log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_endpoint(
        self, key: str, fallback: str = "", wsgi: bool = False, env: dict[str, str] | None = None
    ) -> None:
        keys = {"ENDPOINT_KEY": key, "ENDPOINT_KEY_FALLBACK": fallback, **(env or {})}
        port = str(self.endpoint_port)
        if wsgi:  # a Flask app with the endpoint mounted beside its own routes
            args = [sys.executable, str(HERE / "flask_app.py"), port]
            self.endpoint_url = f"http://127.0.0.1:{port}/api/stepstone"
        else:
            uvicorn = ["-m", "uvicorn", "served_app:asgi", "--port", port, "--log-level", "warning"]
            args = [sys.executable, *uvicorn]
        self.endpoint = self._spawn(args, **keys)
        proc = self.endpoint

        def up() -> bool:
            assert proc.poll() is None, "the endpoint exited"
            try:
                return httpx.get(self.endpoint_url, timeout=2).status_code == 401  # unsigned: refused
            except httpx.HTTPError:
                return False

        wait_for(up, 30, "the endpoint")

    def start_server(self, key: str, fallback: str = "", *extra: str) -> None:
        args = [STEPSTONE, "--log-level", "WARNING", "server", "--database-url", self.db_url]
        port = free_port()
        args += ["--port", str(port), "--signing-key", key, "--push-concurrency", "4", *extra]
        if fallback:
            args += ["--signing-key-fallback", fallback]
        self.server = self._spawn(args, STEPSTONE_API_KEY="api-key-for-tests")
        proc, base = self.server, f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, "the server exited"
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 30, "the server")

    def stop(self, proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(30)

    def register(self, keys: SigningKeys) -> None:
        register_served(self.client, fetch_document(self.endpoint_url, keys), self.endpoint_url)

    def run_of(self, event_id: str) -> str:
        [run] = self.client.runs.list(event_id=event_id)
        return run.id

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.client.close()
        self.log.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    harness = Procs(tmp_path)
    yield harness
    harness.close()
    sys.stdout.write((tmp_path / "procs.log").read_text())  # shown by pytest on failure


def phases(rows: list[tuple[str, str, str, int]], run_id: str) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for rid, step, phase, _pid in rows:
        if rid == run_id:
            counts[step, phase] = counts.get((step, phase), 0) + 1
    return counts


def test_a_sleep_and_a_retried_step_checkpoint_each_step_once(procs: Procs) -> None:
    procs.start_endpoint(OLD)
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD)
    [event_id] = procs.client.send(ss.Event("order", {}))
    run = procs.client.runs.wait(procs.run_of(event_id), timeout="30s")
    assert (run.status, run.output) == ("completed", ["charge", "record", "provision"]), run.error
    counts = phases(ledger({"LEDGER_PATH": procs.ledger}), run.id)
    assert counts == {
        ("charge", "start"): 1,
        ("charge", "end"): 1,
        ("record", "start"): 2,
        ("record", "fail"): 1,
        ("record", "end"): 1,
        ("provision", "start"): 1,
        ("provision", "end"): 1,
    }
    assert {s.id: s.attempts for s in run.steps}["record"] == 2


def _request(run_id: str) -> bytes:
    run = RunRow(
        id=run_id,
        function_id="order",
        status=RunStatus.RUNNING,
        event_ids=["e1"],
        output=None,
        error=None,
        created_at=time.time(),
        started_at=time.time(),
        ended_at=None,
        attempt=0,
        app_version=None,
        parent_run_id=None,
        parent_step_id=None,
    )
    event = EventRow(
        seq=1, id="e1", name="order", data="{}", ts=int(time.time() * 1000), received_at=time.time()
    )
    return encode_request(LeasedRun(run=run, epoch=1, events=[event], steps=[]), "request-1")


def test_bad_signatures_get_401_and_execute_nothing(procs: Procs) -> None:
    procs.start_endpoint(OLD)
    keys = SigningKeys.of(OLD)
    body = _request("forged")
    attempts: dict[str, tuple[bytes, dict[str, str]]] = {
        "missing": (body, {}),
        "tampered": (body.replace(b'"attempt":0', b'"attempt":1'), {SIGNATURE_HEADER: sign(body, keys)}),
        "hour-old": (body, {SIGNATURE_HEADER: sign(body, keys, time.time() - 3600)}),
        "wrong key": (body, {SIGNATURE_HEADER: sign(body, SigningKeys.of(NEW))}),
        "malformed": (body, {SIGNATURE_HEADER: "t=abc,s=zz"}),
    }
    for what, (content, headers) in attempts.items():
        response = httpx.post(procs.endpoint_url, content=content, headers=headers, timeout=10)
        assert response.status_code == 401, what
    assert ledger({"LEDGER_PATH": procs.ledger}) == []  # nothing ran
    good = httpx.post(
        procs.endpoint_url, content=body, headers={SIGNATURE_HEADER: sign(body, keys)}, timeout=30
    )
    assert good.status_code == 200  # the same request, signed: it runs (the first step, then the sleep)
    assert [step for _r, step, phase, _p in ledger({"LEDGER_PATH": procs.ledger}) if phase == "end"] == [
        "charge"
    ]
    assert json.loads(good.content)["decision"]["status"] == "sleeping"


def test_keys_rotate_with_the_fallback_while_runs_continue(procs: Procs) -> None:
    def completes() -> None:
        [event_id] = procs.client.send(ss.Event("order", {}))
        run = procs.client.runs.wait(procs.run_of(event_id), timeout="30s")
        assert run.status == "completed", run.error
        trace = procs.client.runs.trace(run.id)
        assert not [s for s in trace if s.name == "endpoint unavailable"], "a request was refused"

    procs.start_endpoint(OLD, fallback=NEW)  # 1. the endpoint also accepts the new key
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD)
    completes()
    procs.stop(procs.server)  # 2. the server signs with the new key, still accepts the old
    procs.start_server(NEW, fallback=OLD)
    completes()
    procs.stop(procs.endpoint)  # 3. the endpoint signs with the new key
    procs.start_endpoint(NEW, fallback=OLD)
    completes()
    refused = httpx.get(procs.endpoint_url, headers={SIGNATURE_HEADER: sign(b"", SigningKeys.of("x" * 16))})
    assert refused.status_code == 401  # (4. then each side drops the old key)


def test_the_endpoint_killed_mid_run_and_restarted(procs: Procs) -> None:
    """Steps whose checkpoint committed never run again; the run completes."""
    slow = {"MAX_DURATION": "0.5", "STEP_SECONDS": "0.1", "LONG_STEPS": "12"}
    procs.start_endpoint(OLD, env=slow)
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD)
    [event_id] = procs.client.send(ss.Event("long", {}))
    run_id = procs.run_of(event_id)

    def committed() -> set[str]:
        return {s.id for s in procs.client.runs.get(run_id).steps if s.status == "completed"}

    wait_for(lambda: len(committed()) >= 4, 30, "four committed steps")
    procs.stop(procs.endpoint, signal.SIGKILL)
    done_before = committed()  # read after the kill: nothing the endpoint ran can commit now
    procs.start_endpoint(OLD, env=slow)
    run = procs.client.runs.wait(run_id, timeout="60s")
    assert (run.status, run.output) == ("completed", 12), run.error
    counts = phases(ledger({"LEDGER_PATH": procs.ledger}), run_id)
    assert all(counts[step, "start"] == 1 for step in done_before), counts
    assert all(counts.get((f"s{n}", "end"), 0) >= 1 for n in range(12))
    trace = procs.client.runs.trace(run_id)
    assert any(s.name == "endpoint unavailable" for s in trace)  # the outage shows in the trace


def test_a_flask_app_serves_through_serve_wsgi(procs: Procs) -> None:
    procs.start_endpoint(OLD, wsgi=True)
    own_page = httpx.get(procs.endpoint_url.removesuffix("/api/stepstone") + "/", timeout=10)
    assert own_page.text == "the shop's own page"  # the app's own routes are untouched
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD)
    [event_id] = procs.client.send(ss.Event("order", {}))
    run = procs.client.runs.wait(procs.run_of(event_id), timeout="30s")
    assert (run.status, run.output) == ("completed", ["charge", "record", "provision"]), run.error


def test_cancel_of_a_pushed_run_mid_request(procs: Procs, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    procs.start_endpoint(OLD, env={"GATE_PATH": str(gate)})
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD)
    [event_id] = procs.client.send(ss.Event("gated", {}))
    run_id = procs.run_of(event_id)
    wait_for(lambda: phases(ledger({"LEDGER_PATH": procs.ledger}), run_id), 30, "the gate step to start")
    procs.client.runs.cancel(run_id)  # flagged: the request is in flight
    gate.touch()
    run = procs.client.runs.wait(run_id, timeout="30s")
    assert run.status == "cancelled" and run.output is None


def test_invoke_across_a_worker_and_an_endpoint(procs: Procs) -> None:
    local = ss.App("local", database_url=procs.db_url)

    @local.function(id="double", trigger=ss.on_event("double"))
    def double(ctx: ss.Context) -> int:
        return int(ctx.event.data["x"]) * 2

    @local.function(id="local-parent", trigger=ss.on_event("local-parent"))
    async def local_parent(ctx: ss.Context) -> object:
        return await ctx.step.invoke("call", function="square", data={"x": 5}, timeout="30s")

    procs.start_endpoint(OLD)
    procs.register(SigningKeys.of(OLD))
    local.start()  # registers double before the server reads its catalog
    procs.start_server(OLD)
    try:
        [a] = procs.client.send(ss.Event("served-parent", {}))
        [b] = procs.client.send(ss.Event("local-parent", {}))
        first = procs.client.runs.wait(procs.run_of(a), timeout="30s")
        second = procs.client.runs.wait(procs.run_of(b), timeout="30s")
    finally:
        local.close()
    assert (first.status, first.output) == ("completed", 42), first.error
    assert (second.status, second.output) == ("completed", 25), second.error


def test_the_server_killed_mid_request_and_restarted(procs: Procs) -> None:
    """A restarted server resumes the run once the dead one's lease lapses; no
    committed step runs again, and the dead server's lost answer commits nothing."""
    slow = {"MAX_DURATION": "0.5", "STEP_SECONDS": "0.1", "LONG_STEPS": "12"}
    procs.start_endpoint(OLD, env=slow)
    procs.register(SigningKeys.of(OLD))
    procs.start_server(OLD, "", "--push-lease-ttl", "2")
    [event_id] = procs.client.send(ss.Event("long", {}))
    run_id = procs.run_of(event_id)

    def committed() -> set[str]:
        return {s.id for s in procs.client.runs.get(run_id).steps if s.status == "completed"}

    wait_for(lambda: len(committed()) >= 4, 30, "four committed steps")
    procs.stop(procs.server, signal.SIGKILL)  # most likely mid-request: requests follow each other
    done_before = committed()
    procs.start_server(OLD, "", "--push-lease-ttl", "2")
    run = procs.client.runs.wait(run_id, timeout="60s")
    assert (run.status, run.output) == ("completed", 12), run.error
    counts = phases(ledger({"LEDGER_PATH": procs.ledger}), run_id)
    assert all(counts[step, "start"] == 1 for step in done_before), counts
    assert all(counts.get((f"s{n}", "end"), 0) >= 1 for n in range(12))
