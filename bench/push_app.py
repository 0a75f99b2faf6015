"""The served side of ``bench_push.py``: ``steps`` runs STEPS no-op steps
(served by uvicorn as ``push_app:asgi``; no database)."""

from __future__ import annotations

import os

import stepstone as ss

STEPS = int(os.environ.get("STEPS", "10"))
app = ss.App("bench-served", database_url="sqlite:////nonexistent/never-opened.db")


async def nothing(n: int) -> int:
    return n


async def steps(ctx: ss.Context) -> int:
    for n in range(STEPS):
        await ctx.step.run(f"s{n}", nothing, n)
    return STEPS


app.function(id="pushed-steps", trigger=ss.on_event("bench.pushed"))(steps)
asgi = ss.serve(app, signing_key=os.environ.get("ENDPOINT_KEY", "only-imported-" + "x" * 16))
