"""Per-step overhead with middleware (issue 8): a no-op middleware (every hook
overridden, doing nothing) and the encryption middleware, as ratios to the
plain per-step overhead measured in the same run (SQLite, both durabilities).

    .venv/bin/python bench/bench_middleware.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_core import per_step

import stepstone as ss


class NoOp(ss.Middleware):
    def transform_input(self, ctx: ss.Context, steps: dict[str, Any]) -> None:
        return None

    def before_execution(self, ctx: ss.Context) -> None:
        pass

    def after_execution(self, ctx: ss.Context) -> None:
        pass

    def before_step(self, ctx: ss.Context, step_id: str) -> None:
        pass

    def after_step(self, ctx: ss.Context, step_id: str, output: Any, error: BaseException | None) -> None:
        pass

    def transform_output(self, ctx: ss.Context, output: Any, step_id: str | None) -> Any:
        return output


def measure(sync: str, middleware: tuple[ss.Middleware, ...]) -> float:
    samples = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as folder:
            samples.append(statistics.median(asyncio.run(per_step(folder, sync, 600, middleware))))
    return statistics.median(samples)


def main() -> int:
    for sync in ("full", "normal"):
        plain = measure(sync, ())
        noop = measure(sync, (NoOp(),))
        crypto = measure(sync, (ss.EncryptionMiddleware("benchmark key"),))
        print(
            f"synchronous={sync}: per-step p50 plain {plain * 1e6:7.1f} us, "
            f"no-op middleware {noop * 1e6:7.1f} us ({noop / plain:.2f}x), "
            f"encryption {crypto * 1e6:7.1f} us ({crypto / plain:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
