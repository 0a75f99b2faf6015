"""Functions for the step-timeout process tests: a sync step that hangs for
good, and a quick run (imported by `stepstone worker` processes)."""

from __future__ import annotations

import os
import threading

import stepstone as ss

app = ss.App("timeouts", database_url=os.environ["STEPSTONE_DATABASE_URL"])
NEVER = threading.Event()  # nobody sets it: the step hangs until the process ends


@app.function(id="hung", trigger=ss.on_event("hang"), step_timeout="300ms", retries=0)
def hung(ctx: ss.Context) -> None:
    ctx.step.run("provider-call", NEVER.wait)


@app.function(id="quick", trigger=ss.on_event("quick"))
def quick(ctx: ss.Context) -> str:
    return str(ctx.step.run("s", lambda: "done"))
