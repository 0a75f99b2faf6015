"""A private, throw-away PostgreSQL cluster for the tests and the benchmark.

``PgCluster.start()`` runs ``initdb`` in a temporary directory (as the
``postgres`` OS user when we are root: initdb refuses root), starts the server
on a free loopback port and returns the cluster; ``stop()`` stops it and
deletes the directory. Nothing outside the temporary directory is touched,
except creating the ``postgres`` user when running as root without one.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import psycopg

# Tests need no durability. Deadlocks between flow-control writes to the shared
# partition rows do happen under contention (the store runs the victim again);
# finding them after 100 ms instead of the default 1 s keeps timing-based tests
# from stalling on one.
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "deadlock_timeout": "100ms",
}


class PgUnavailable(RuntimeError):
    """PostgreSQL server binaries are missing or the cluster could not start."""


def pg_missing(reason: str) -> NoReturn:
    """Skip the test without PostgreSQL, or fail it when ``CI`` is set."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required when CI is set: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


def find_bindir() -> str:
    explicit = os.environ.get("STEPSTONE_PG_BINDIR")
    candidates = [explicit] if explicit else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if folder and os.path.exists(os.path.join(folder, "initdb")):
            return folder
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    raise PgUnavailable("no PostgreSQL server binaries (initdb) found")


def _memory_dir() -> str | None:
    """A memory-backed directory (Linux's /dev/shm) when there is one to write to."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_owner() -> tuple[list[str], int | None]:
    """The command prefix that runs as the cluster owner, and its uid to chown to."""
    if os.geteuid() != 0:
        return [], None
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "postgres"], check=True, capture_output=True
        )
        uid = pwd.getpwnam("postgres").pw_uid
    return ["runuser", "-u", "postgres", "--"], uid


class PgCluster:
    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bindir = find_bindir()
        self.settings = dict(FAST_SETTINGS if settings is None else settings)
        self.prefix, self.uid = _as_owner()
        # A cluster that does not fsync loses nothing by living in memory, and
        # creating and deleting hundreds of databases there is ten times faster.
        scratch = _memory_dir() if self.settings.get("fsync") == "off" else None
        self.root = tempfile.mkdtemp(prefix="stepstone-pg-", dir=scratch)
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        self.port = 0
        self._server_version: int | None = None
        if self.uid is not None:
            os.chown(self.root, self.uid, -1)

    # -- lifecycle -----------------------------------------------------------------
    @classmethod
    def start_new(cls, settings: dict[str, str] | None = None) -> PgCluster:
        cluster = cls(settings)
        try:
            cluster._initdb()
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _run(self, args: Sequence[str], timeout: float = 120) -> None:
        # cwd: the cluster owner may not be allowed into the caller's directory
        result = subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if result.returncode != 0:
            raise PgUnavailable(f"{args[0]} failed: {result.stdout}{result.stderr}{self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n" + Path(self.log).read_text()[-2000:]
        return ""

    def _initdb(self) -> None:
        self._run(
            [
                f"{self.bindir}/initdb",
                "-D",
                self.data,
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ]
        )

    def start(self) -> None:
        """Start (or restart after ``stop_server``) on a free loopback port."""
        for _attempt in range(5):
            self.port = self.port or free_port()
            options = " ".join(
                [
                    f"-p {self.port}",
                    "-c listen_addresses=127.0.0.1",
                    f"-k {self.root}",
                    "-c max_connections=300",
                ]
                + [f"-c {k}={v}" for k, v in self.settings.items()]
            )
            try:
                self._run(
                    [
                        f"{self.bindir}/pg_ctl",
                        "-D",
                        self.data,
                        "-l",
                        self.log,
                        "-o",
                        options,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                )
                return
            except PgUnavailable:
                if "could not bind" not in self._log_tail():
                    raise
                self.port = 0  # the port was taken meanwhile: pick another
        raise PgUnavailable("could not find a free port")

    def stop_server(self, mode: str = "fast") -> None:
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"])

    def restart(self) -> None:
        """Stop the server (closing every connection) and start it again on the same port."""
        self.stop_server()
        self.start()

    def stop(self) -> None:
        """Stop the server and delete the cluster (kept, with its server.log, when
        ``STEPSTONE_PG_KEEP`` is set: for debugging)."""
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            with contextlib.suppress(PgUnavailable, subprocess.TimeoutExpired):
                self.stop_server("immediate")
        if os.environ.get("STEPSTONE_PG_KEEP"):
            print(f"PostgreSQL cluster kept in {self.root}")
            return
        shutil.rmtree(self.root, ignore_errors=True)

    # -- databases -----------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(sql.encode())

    def create_database(self, name: str, template: str | None = None) -> str:
        clause = f" TEMPLATE {template}" if template else ""
        if template and self._version() >= 150000:
            clause += " STRATEGY FILE_COPY"  # copies the files: no WAL for the whole template
        self.execute(f"CREATE DATABASE {name}{clause}")
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, closing any connection a test left open."""
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _version(self) -> int:
        if self._server_version is None:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                self._server_version = int(conn.info.server_version)
        return self._server_version


@contextlib.contextmanager
def running_cluster() -> Iterator[PgCluster]:
    """A new cluster for the block (a fixture's lifetime); the test is skipped,
    or failed under ``CI``, when PostgreSQL cannot run here."""
    try:
        cluster = PgCluster.start_new()
    except Exception as exc:  # noqa: BLE001 - any reason PostgreSQL cannot run here
        pg_missing(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
