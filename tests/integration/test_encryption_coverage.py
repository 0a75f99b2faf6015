"""Encryption covers every event the engine writes on a user's behalf (issue
14, point 4): the data of ``step.invoke``, events sent from a step, the
child's output forwarded to its parent, the system events that embed them.
The raw database (the SQLite file and its WAL, every text column on
PostgreSQL) holds no plaintext, and the child still sees its data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import stepstone as ss

from ..conftest import FAST, query, send_and_wait
from ..polling import wait_for

MARKER = "plaintext-marker-7f3a91c2"


def _sqlite_bytes(db_url: str) -> bytes:
    path = Path(db_url.removeprefix("sqlite:///"))
    wal = path.with_name(path.name + "-wal")
    assert wal.exists()  # the WAL holds the latest commits: it must be scanned too
    return path.read_bytes() + wal.read_bytes()


def _postgres_text(db_url: str) -> str:
    columns = query(
        db_url,
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() "
        "AND data_type IN ('text', 'json', 'jsonb', 'character varying', 'bytea')",
    )
    assert columns
    return "\n".join(
        str(row)
        for table, column in columns
        for row in query(db_url, f'SELECT "{column}"::text FROM "{table}"')
    )


def test_invoke_data_sent_events_and_outputs_leave_no_plaintext(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    app = make_app(middleware=[ss.EncryptionMiddleware("a long random secret for tests")])
    received: list[Any] = []

    @app.function(id="child", retries=0)
    def child(ctx: ss.Context) -> dict[str, Any]:
        received.append(ctx.event.data["encrypted"])
        return {"echo": ctx.event.data["encrypted"]}

    @app.function(id="parent", trigger=ss.on_event("go"), backoff=FAST)
    def parent(ctx: ss.Context) -> dict[str, Any]:
        secret = ctx.event.data["encrypted"]
        echoed = ctx.step.invoke("call-child", function=child, data={"tenant": "t1", "encrypted": secret})
        ctx.step.send_event("tell", ss.Event("told", {"tenant": "t1", "encrypted": echoed["echo"]}))
        return {"secret": echoed["echo"]}

    @app.function(id="listener", trigger=ss.on_event("told", if_="event.data.tenant == 't1'"))
    def listener(ctx: ss.Context) -> str:
        return str(ctx.event.data["encrypted"])

    app.start()
    run = send_and_wait(app, ss.Event("go", {"encrypted": MARKER}))
    assert run.status == "completed", run.error
    assert received == [MARKER]  # the child sees plaintext
    wait_for(lambda: len(app.runs.list(function_id="listener", status="completed")) == 1, 10, "the listener")
    [told] = app.runs.list(function_id="listener")
    assert ss.is_encrypted(told.output)
    app.stop()
    if db_url.startswith("sqlite:"):
        assert MARKER.encode() not in _sqlite_bytes(db_url)
    else:
        assert MARKER not in _postgres_text(db_url)
