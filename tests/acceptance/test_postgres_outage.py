"""PostgreSQL restarted under load: workers reconnect and finish every run,
and no step whose checkpoint committed runs again."""

from __future__ import annotations

import itertools
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss
from stepstone.errors import StoreUnavailableError

from ..pgcluster import PgCluster, running_cluster
from .procs import client, completed, ledger, migrated, wait_for

Spawn = Callable[..., subprocess.Popen[bytes]]
_names = itertools.count()


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    """A cluster of this module's own: restarting it disturbs no other test."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def db_url(own_cluster: PgCluster) -> str:
    """PostgreSQL only (overrides the backend-parametrized fixture)."""
    url = own_cluster.create_database(f"outage_{next(_names)}")
    migrated(url)
    return url


def tolerant(predicate: Callable[[], Any]) -> Callable[[], Any]:
    """The test's own reads may fail while the server is down: that is not an answer."""

    def check() -> Any:
        try:
            return predicate()
        except StoreUnavailableError:
            return False

    return check


def test_workers_ride_out_a_postgresql_restart(
    env: dict[str, str], spawn: Spawn, own_cluster: PgCluster, worker_log: Path
) -> None:
    env["STEP_SECONDS"] = "0.1"
    app = client(env)
    workers = [spawn("--concurrency", "4", "--lease-ttl", "5", "--instance-id", name) for name in "ab"]
    wait_for(lambda: len(app.workers.list()) == 2, 30, "both workers to register")
    app.send([ss.Event("work", id=f"order-{i}") for i in range(80)])
    wait_for(lambda: sum(1 for r in ledger(env) if r[2] == "end") >= 40, 60, "the load to be under way")
    own_cluster.stop_server()  # fast shutdown: every connection is terminated
    ended_before = sum(1 for r in ledger(env) if r[2] == "end")
    # the server stays down until the workers have found it refusing connections
    wait_for(lambda: worker_log.read_text().count("Connection refused") >= 2, 30, "failed reconnections")
    own_cluster.start()
    wait_for(tolerant(lambda: completed(app) == 80), 90, "every run to complete")

    assert ended_before < 240  # the restart happened mid-load
    starts = Counter((r[0], r[1]) for r in ledger(env) if r[2] == "start")
    assert len(starts) == 240  # nothing lost
    assert max(starts.values()) == 1  # no step ran twice: checkpoints were retried, not steps
    for run in app.runs.list(limit=100):
        assert run.output == ["charge", "record", "provision"]
    assert all(w.poll() is None for w in workers)  # the workers rode it out
    for w in workers:
        w.send_signal(signal.SIGTERM)
        assert w.wait(30) == 0
    app.close()
