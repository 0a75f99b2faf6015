"""The three-step workflow the PostgreSQL benchmark's worker processes run."""

from __future__ import annotations

import os

import stepstone as ss

app = ss.App("bench", database_url=os.environ["STEPSTONE_DATABASE_URL"])


async def trivial() -> int:
    return 1


@app.function(id="three", trigger=ss.on_event("three"))
async def three(ctx: ss.Context) -> int:
    for name in ("a", "b", "c"):
        await ctx.step.run(name, trivial)
    return 3
