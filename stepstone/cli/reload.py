"""``stepstone dev`` reloading: run the app in a child process, restart it when a
Python file under the app's directory changes.

A child that exits because its port is taken (``ports.PORT_IN_USE``) ends the
loop with its status: no code change can free the port.

The parent only polls file modification times (skipping hidden directories,
virtual environments and caches) and manages the child; the child is a plain
``stepstone dev --no-reload``. A child that crashes (a syntax error, say) is
reported, and started again at the next change.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib.machinery import PathFinder
from pathlib import Path
from types import FrameType

from stepstone.cli.common import errors
from stepstone.cli.ports import PORT_IN_USE

_SKIP = {"__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist"}
Snapshot = dict[str, tuple[int, int]]


def watch_root(target: str) -> Path:
    """The directory of ``MODULE:app``'s top-level package (or of its module
    file), located without importing anything; else the working directory."""
    top = target.partition(":")[0].split(".")[0]
    spec = PathFinder.find_spec(top, [os.getcwd(), *sys.path]) if top else None
    if spec is None or spec.origin is None or not os.path.exists(spec.origin):
        return Path.cwd()
    return Path(spec.origin).resolve().parent


def snapshot(root: Path) -> Snapshot:
    """``{path: (mtime_ns, size)}`` of every ``.py`` file under ``root``."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and d not in _SKIP
            and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg"))
        ]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                found[path] = (stat.st_mtime_ns, stat.st_size)
    return found


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        root: Path,
        *,
        interval: float = 0.3,
        grace: float = 15.0,
    ) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **env}
        self.root = root
        self.interval = interval
        self.grace = grace
        self.stopping = False

    def _stop_requested(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop_requested)
        signal.signal(signal.SIGINT, self._stop_requested)
        errors.print(f"watching {self.root} for changes", highlight=False)
        files = snapshot(self.root)
        child = self._spawn()
        reported = False
        while not self.stopping:
            time.sleep(self.interval)  # the watcher's polling period
            current = snapshot(self.root)
            if current != files:
                time.sleep(self.interval)  # let an editor finish writing
                files = snapshot(self.root)
                errors.print("change detected: restarting", highlight=False)
                self._stop(child)
                child, reported = self._spawn(), False
            elif child.poll() == PORT_IN_USE:
                return PORT_IN_USE
            elif child.poll() is not None and not reported:
                reported = True
                errors.print(f"the app exited ({child.returncode}); waiting for a change", highlight=False)
        self._stop(child)
        return 0

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv, env=self.env)

    def _stop(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            child.terminate()  # uvicorn shuts down gracefully: workers drain
            try:
                child.wait(self.grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
