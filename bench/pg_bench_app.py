"""The three-step workflow the PostgreSQL benchmark's worker processes run."""

from __future__ import annotations

import os

from workloads import add_three_steps

import stepstone as ss

app = ss.App("bench", database_url=os.environ["STEPSTONE_DATABASE_URL"])
add_three_steps(app)
