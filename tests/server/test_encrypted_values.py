"""The API shows encrypted step data as "encrypted", never as ciphertext."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import stepstone as ss

from .conftest import Live


def test_encrypted_outputs_show_as_encrypted(tmp_path: Path, serve: Callable[..., Live]) -> None:
    app = ss.App(
        "secret",
        database_url=f"sqlite:///{tmp_path}/s.db",
        middleware=[ss.EncryptionMiddleware("a long random test secret")],
    )

    @app.function(id="vault", trigger=ss.on_event("store"))
    def vault(ctx: ss.Context) -> dict[str, str]:
        pin = ctx.step.run("read-pin", lambda: "1234-secret")
        return {"pin": pin}

    live = serve(app, workers=True)
    [event_id] = live.http.post("/api/v1/events", json={"name": "store", "data": {}}).json()["ids"]
    deadline = time.monotonic() + 20
    while True:
        [run] = live.http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"] or [None]
        if run and run["status"] == "completed":
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    shown = live.http.get(f"/api/v1/runs/{run['id']}").json()
    assert shown["output"] == "encrypted"
    assert shown["steps"][0]["output"] == "encrypted"
    assert "1234" not in live.http.get(f"/api/v1/runs/{run['id']}").text
    assert "1234" not in live.http.get(f"/api/v1/runs/{run['id']}/trace").text
