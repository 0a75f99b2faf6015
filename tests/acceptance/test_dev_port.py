"""`stepstone dev` on a port another process holds: it exits at once with a
clear message naming the port, with and without reloading (the reload loop must
not keep waiting for a change). A real subprocess, bounded by a deadline."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.test_dev import MODULE, STEPSTONE

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("reload", ["--reload", "--no-reload"])
def test_dev_on_a_taken_port_exits_naming_the_port(tmp_path: Path, reload: str) -> None:
    (tmp_path / "devmod.py").write_text(MODULE.format(version="v1"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            [STEPSTONE, "dev", "devmod:app", "--port", str(port), reload],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "STEPSTONE_DATABASE_URL": f"sqlite:///{tmp_path}/dev.db"},
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "already in use" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 20
