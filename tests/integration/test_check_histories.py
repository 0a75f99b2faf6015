"""Exported histories (issue 13, point 2): ``app.runs.export`` writes what the
store holds, JSON round-trips it, ``app.check(histories=...)`` replays it
without a database; encrypted outputs stay sealed in the file and are opened
at check time with the checking app's key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepstone as ss

from ..conftest import run_of
from ..polling import wait_for
from .test_check import LEDGER, _deploy, _leave_sleeping_runs, audit, charge, email, v1

KEY = "0123456789abcdef0123456789abcdef"


def _exported(app: ss.App, run_id: str, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"{run_id}.json"
    path.write_text(json.dumps(app.runs.export(run_id)))
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def test_an_exported_history_is_checked_without_the_database(
    make_app: Callable[..., ss.App], tmp_path: Path
) -> None:
    [run_id, _] = _leave_sleeping_runs(make_app)
    reader = make_app("reader")
    history = _exported(reader, run_id, tmp_path)
    assert asyncio.run(reader.runs.export_async(run_id)) == history
    assert (history["function_id"], history["status"]) == ("order", "sleeping")
    assert [(s["id"], s["kind"], s["fingerprint"], s["status"]) for s in history["steps"]] == [
        ("charge", "run", "charge", "completed"),
        ("email", "run", "email", "completed"),
        ("cool-off", "sleep", None, "sleeping"),
    ]
    assert history["steps"][0]["output"] == {"id": "ch_1", "amount": 5}

    offline = ss.App("shop", database_url=f"sqlite:///{tmp_path}/never-opened.db")
    offline.function(id="order", trigger=ss.on_event("order"))(v1)
    assert offline.check(histories=[history]).ok
    assert asyncio.run(offline.check_async(histories=[history])).ok
    assert not (tmp_path / "never-opened.db").exists()

    async def audited_first(ctx: ss.Context) -> None:
        await ctx.step.run("audit", audit)
        await v1(ctx)

    changed = ss.App("shop", database_url=f"sqlite:///{tmp_path}/never-opened.db")
    changed.function(id="order", trigger=ss.on_event("order"))(audited_first)
    [found] = changed.check(histories=[history]).incompatible
    assert (found.run_id, found.reason, found.step_id) == (run_id, "new-step", "audit")
    assert LEDGER == []


def test_a_history_of_a_function_the_app_lacks_is_an_error(
    make_app: Callable[..., ss.App], tmp_path: Path
) -> None:
    [run_id, _] = _leave_sleeping_runs(make_app)
    history = _exported(make_app("reader"), run_id, tmp_path)
    other = ss.App("other", database_url=f"sqlite:///{tmp_path}/x.db")
    [found] = other.check(histories=[history]).incompatible
    assert (found.reason, found.missing) == ("error", ["charge", "email", "cool-off"])


def test_bad_histories_and_missing_runs_are_refused(make_app: Callable[..., ss.App]) -> None:
    app = _deploy(make_app, v1)
    with pytest.raises(ss.ConfigError, match="histories"):
        app.check(histories=[{"steps": []}])
    with pytest.raises(ss.ConfigError, match="malformed"):
        app.check(histories=[{"format": "stepstone.history/1", "run_id": "r"}])
    with pytest.raises(ss.NotFoundError):
        app.runs.export("missing")


async def reads_the_payment(ctx: ss.Context) -> str:
    payment = await ctx.step.run("charge", charge)
    label = f"payment {payment['id']}"  # handler code between steps needs the decrypted value
    await ctx.step.run("email", email, payment)
    await ctx.step.sleep("cool-off", "1h")
    return label


def test_encrypted_outputs_stay_sealed_in_the_file_and_open_at_check_time(
    make_app: Callable[..., ss.App], tmp_path: Path
) -> None:
    sealed = _deploy(make_app, reads_the_payment, middleware=[ss.EncryptionMiddleware(KEY)])
    sealed.start()
    run_id = run_of(sealed, sealed.send(ss.Event("order"))[0]).id
    wait_for(lambda: sealed.runs.get(run_id).status == "sleeping", 10, "the run to sleep")
    sealed.stop()
    LEDGER.clear()
    history = _exported(sealed, run_id, tmp_path)
    assert ss.is_encrypted(history["steps"][0]["output"])
    assert "ch_1" not in json.dumps(history)

    keyed = _deploy(make_app, reads_the_payment, middleware=[ss.EncryptionMiddleware(KEY)])
    assert keyed.check(histories=[history]).ok
    assert keyed.check().ok
    keyless = _deploy(make_app, reads_the_payment)
    [found] = keyless.check(histories=[history]).incompatible
    assert found.reason == "error"  # the handler cannot read a sealed payment
    assert LEDGER == []
