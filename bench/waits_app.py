"""The app the wait benchmark's worker process runs."""

import os

import stepstone as ss

app = ss.App("bench-waits", database_url=os.environ["STEPSTONE_DATABASE_URL"])


@app.function(id="waiter", trigger=ss.on_event("bench.start"))
async def waiter(ctx: ss.Context) -> object:
    got = await ctx.step.wait_for_event(
        "done", event="bench.done", if_="async.data.k == event.data.k", timeout="7d"
    )
    return got.data if got else None
