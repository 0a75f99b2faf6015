"""Fixtures for process tests: a side-effect ledger and `stepstone worker` processes
on the test's database (``db_url``: SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .procs import create_ledger

HERE = Path(__file__).parent
STEPSTONE = str(Path(sys.executable).parent / "stepstone")


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> dict[str, str]:
    ledger = tmp_path / "ledger.db"
    create_ledger(str(ledger))
    return {
        **os.environ,
        "STEPSTONE_DATABASE_URL": db_url,
        "LEDGER_PATH": str(ledger),
        "PYTHONPATH": os.pathsep.join((str(HERE), str(HERE.parents[1]))),  # ledger_app, tests.*
    }


@pytest.fixture
def worker_log(tmp_path: Path) -> Path:
    return tmp_path / "workers.log"


@pytest.fixture
def spawn(env: dict[str, str], worker_log: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    log = worker_log.open("ab")

    def start(*args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [STEPSTONE, "--log-level", "WARNING", "worker", "ledger_app:app", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    log.close()
    sys.stdout.write(worker_log.read_text())  # shown by pytest on failure
