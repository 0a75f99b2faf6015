"""``/api/v1/apps`` over real HTTP: a live server with a signing key registers
apps that real uvicorn endpoints serve with ``ss.serve`` (no database), and
refuses, whole, whatever it cannot trust: a wrong key on either side, an
unsigned answer, an invalid description, an id or name another app owns."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

import stepstone as ss
from stepstone.introspection import describe_app
from stepstone.signing import SigningKeys
from stepstone.store import faults
from tests.server.conftest import API_KEY, Live
from tests.server.endpoints import KEY, OTHER, Asgi, Endpoint, raw_endpoint, served, serving


@pytest.fixture
def server(serve: Callable[..., Live], make_app: Callable[..., ss.App]) -> Live:
    """A live server (both stores) holding the signing key, without workers: runs
    of served functions stay queued until the push executor takes them."""
    return serve(make_app("server"), signing=SigningKeys.of(KEY))


def sync(live: Live, url: Any) -> httpx.Response:
    return live.http.post("/api/v1/apps", json={"url": url})


def functions(live: Live) -> dict[str, dict[str, Any]]:
    return {f["id"]: f for f in live.http.get("/api/v1/functions").json()["functions"]}


def apps(live: Live) -> list[dict[str, Any]]:
    return list(live.http.get("/api/v1/apps").json()["apps"])


def send(live: Live, name: str) -> list[dict[str, Any]]:
    """Send an event; the runs it started."""
    response = live.http.post("/api/v1/events", json={"name": name})
    assert response.status_code == 200, response.text
    [event_id] = response.json()["ids"]
    return list(live.http.get("/api/v1/runs", params={"event_id": event_id}).json()["runs"])


def test_a_synced_app_registers_its_functions_and_events_start_queued_runs(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    served_at = endpoint(serving("charge", "ship"))
    response = sync(server, served_at.url)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["url"], body["app"], body["app_version"]) == (served_at.url, "store-front", "v1")
    assert body["functions"] == ["charge", "ship"] and body["error"] is None
    assert body["max_duration"] == 60.0
    registered = functions(server)
    for function_id in ("charge", "ship"):
        assert registered[function_id]["app"] == "store-front"
        assert registered[function_id]["config"]["serve_url"] == served_at.url
        assert registered[function_id]["retired"] is False
    assert apps(server) == [body]
    [run] = send(server, "charge/go")
    assert (run["function_id"], run["status"]) == ("charge", "queued")
    again = sync(server, served_at.url).json()  # a second sync changes nothing but its time
    assert again["created_at"] == body["created_at"] and again["synced_at"] >= body["synced_at"]


def test_a_wrong_key_on_either_side_or_an_unsigned_answer_is_a_502_and_registers_nothing(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    cases = {
        "refused this server's signature (HTTP 401: signature does not match)": serving("charge", key=OTHER),
        "not signed with this server's key: signature does not match": serving(
            "charge", key=OTHER, fallback=KEY
        ),  # it accepts the server's key but answers under its own
        "not signed with this server's key: missing X-Stepstone-Signature": raw_endpoint(
            describe_app(
                "store-front", served("charge").registry, app_version=None, max_duration=60
            ).to_json(),
            signed=False,
        ),
    }
    for reason, asgi in cases.items():
        response = sync(server, endpoint(asgi).url)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["type"] == "EndpointError"
        assert reason in response.json()["error"]["message"]
    assert functions(server) == {} and apps(server) == []
    assert send(server, "charge/go") == []


def test_an_unreachable_endpoint_keeps_its_functions_and_shows_the_error_until_a_good_sync(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    served_at = endpoint(serving("charge"))
    first = sync(server, served_at.url).json()
    served_at.stop()
    response = sync(server, served_at.url)
    assert response.status_code == 502 and "cannot reach" in response.json()["error"]["message"]
    [listed] = apps(server)
    assert "cannot reach" in listed["error"] and listed["error_at"] is not None
    assert listed["synced_at"] == first["synced_at"] and listed["functions"] == ["charge"]
    assert functions(server)["charge"]["retired"] is False
    [run] = send(server, "charge/go")  # its events still start runs
    assert run["status"] == "queued"
    served_at.start()
    assert sync(server, served_at.url).status_code == 200
    [listed] = apps(server)
    assert listed["error"] is None and listed["error_at"] is None


def test_a_resync_retires_what_the_endpoint_dropped_and_brings_back_what_it_serves_again(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    served_at = endpoint(serving("charge", "ship"))
    assert sync(server, served_at.url).status_code == 200
    served_at.deploy(serving("charge", version="v2"))
    body = sync(server, served_at.url).json()
    assert (body["functions"], body["app_version"]) == (["charge"], "v2")
    assert functions(server)["ship"]["retired"] is True
    assert send(server, "ship/go") == []
    assert [r["function_id"] for r in send(server, "charge/go")] == ["charge"]
    served_at.deploy(serving(version="v3"))  # serving nothing retires everything
    assert sync(server, served_at.url).json()["functions"] == []
    assert {f["retired"] for f in functions(server).values()} == {True}
    served_at.deploy(serving("charge", "ship", version="v4"))
    assert sync(server, served_at.url).status_code == 200
    assert {f["id"]: f["retired"] for f in functions(server).values()} == {"charge": False, "ship": False}
    served_at.deploy(serving("charge", name="renamed"))  # the endpoint renamed its app
    assert sync(server, served_at.url).json()["app"] == "renamed"
    found = functions(server)
    assert (found["charge"]["app"], found["charge"]["retired"], found["ship"]["retired"]) == (
        "renamed",
        False,
        True,
    )


def test_an_id_or_a_name_another_app_owns_is_a_409_and_writes_nothing(
    server: Live, endpoint: Callable[[Asgi], Endpoint], make_app: Callable[..., ss.App]
) -> None:
    warehouse = make_app("warehouse")
    warehouse.function(id="ship", trigger=ss.on_event("ship/go"))(lambda ctx: None)
    warehouse.store  # noqa: B018 - a worker deploy registers "ship"
    response = sync(server, endpoint(serving("charge", "ship")).url)
    assert response.status_code == 409, response.text
    message = response.json()["error"]["message"]
    assert "function 'ship' is already registered by app 'warehouse' (served by workers)" in message
    assert set(functions(server)) == {"ship"} and functions(server)["ship"]["app"] == "warehouse"
    assert apps(server) == []

    first = endpoint(serving("charge"))
    assert sync(server, first.url).status_code == 200
    same_name = sync(server, endpoint(serving("refund")).url)
    assert same_name.status_code == 409
    assert f"app 'store-front' is already served from {first.url}" in same_name.json()["error"]["message"]
    same_id = sync(server, endpoint(serving("charge", name="other-front")).url)
    assert same_id.status_code == 409
    assert f"(served from {first.url})" in same_id.json()["error"]["message"]
    workers_name = sync(server, endpoint(serving("pack", name="warehouse")).url)
    assert workers_name.status_code == 409
    assert "app name 'warehouse' is used by workers" in workers_name.json()["error"]["message"]
    assert set(functions(server)) == {"ship", "charge"} and [a["url"] for a in apps(server)] == [first.url]
    assert apps(server)[0]["error"] is None  # another URL's failures are not this app's


def test_a_conflict_on_resync_is_recorded_and_changes_no_function(
    server: Live, endpoint: Callable[[Asgi], Endpoint], make_app: Callable[..., ss.App]
) -> None:
    served_at = endpoint(serving("charge"))
    assert sync(server, served_at.url).status_code == 200
    warehouse = make_app("warehouse")
    warehouse.function(id="ship", trigger=ss.on_event("ship/go"))(lambda ctx: None)
    warehouse.store  # noqa: B018
    served_at.deploy(serving("ship"))  # drops charge, takes a worker's id
    assert sync(server, served_at.url).status_code == 409
    assert functions(server)["charge"]["retired"] is False  # nothing retired either
    [listed] = apps(server)
    assert "already registered by app 'warehouse'" in listed["error"] and listed["functions"] == ["charge"]


def test_an_invalid_description_is_a_502_naming_the_function_and_registers_nothing(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    document = describe_app(
        "store-front", served("charge", "ship").registry, app_version=None, max_duration=60
    ).to_json()
    document["functions"][1]["retries"] = 1000
    response = sync(server, endpoint(raw_endpoint(document)).url)
    assert response.status_code == 502
    assert "function 'ship' has an invalid description" in response.json()["error"]["message"]
    assert "retries" in response.json()["error"]["message"]
    document["functions"][1] = {"id": "ship", "triggers": [{"cron": "not a schedule"}]}
    assert "function 'ship'" in sync(server, endpoint(raw_endpoint(document)).url).json()["error"]["message"]
    not_a_document = sync(server, endpoint(raw_endpoint({"protocol": 1, "app": ""})).url)
    assert not_a_document.status_code == 502 and "not an app document" in not_a_document.text
    assert functions(server) == {} and apps(server) == []


BAD_URLS = [
    "",
    "  ",
    "ftp://host/x",
    "not a url",
    "http://",
    "http://h/#part",
    "http://u:p@h/",
    "http://h:99999/",
    7,
]


def test_a_bad_url_is_a_422_naming_it(server: Live) -> None:
    for url in BAD_URLS:
        response = sync(server, url)
        assert response.status_code == 422, (url, response.text)
        assert response.json()["error"]["field"] == "url"
    assert apps(server) == []


def test_a_server_without_a_signing_key_refuses_to_sync(
    serve: Callable[..., Live], make_app: Callable[..., ss.App], endpoint: Callable[[Asgi], Endpoint]
) -> None:
    keyless = serve(make_app("keyless"))
    response = sync(keyless, endpoint(serving("charge")).url)
    assert response.status_code == 409
    assert "no signing key" in response.json()["error"]["message"]
    assert functions(keyless) == {}


def test_unregistering_retires_the_functions_and_leaves_started_runs(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    served_at = endpoint(serving("charge"))
    assert sync(server, served_at.url).status_code == 200
    [run] = send(server, "charge/go")
    response = server.http.delete("/api/v1/apps", params={"url": served_at.url})
    assert response.status_code == 200 and response.json()["functions"] == ["charge"]
    assert apps(server) == [] and functions(server)["charge"]["retired"] is True
    assert send(server, "charge/go") == []
    assert server.http.get(f"/api/v1/runs/{run['id']}").json()["status"] == "queued"
    again = server.http.delete("/api/v1/apps", params={"url": served_at.url})
    assert again.status_code == 404
    assert sync(server, served_at.url).status_code == 200  # registering again brings it back
    assert functions(server)["charge"]["retired"] is False


def test_the_client_syncs_lists_and_unregisters(server: Live, endpoint: Callable[[Asgi], Endpoint]) -> None:
    served_at = endpoint(serving("charge"))
    with ss.Client(server.url, api_key=API_KEY) as client:
        row = client.apps.sync(served_at.url)
        assert (row.app, row.function_ids, row.error) == ("store-front", ("charge",), None)
        assert client.apps.list() == [row]
        served_at.stop()
        with pytest.raises(ss.EndpointError, match="cannot reach"):
            client.apps.sync(served_at.url)
        [listed] = client.apps.list()
        assert listed.error is not None and listed.synced_at == row.synced_at
        assert client.apps.unregister(served_at.url).url == served_at.url
        assert client.apps.list() == []


def test_racing_syncs_of_one_function_id_from_many_urls_register_it_once(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    urls = [endpoint(serving("charge", name=f"front-{n}")).url for n in range(6)]
    urls += [endpoint(serving("refund")).url for _ in range(2)]  # and one app name from two URLs
    start = threading.Barrier(len(urls))

    def racer(url: str) -> int:
        with httpx.Client(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as http:
            start.wait()
            return http.post(f"{server.url}/api/v1/apps", json={"url": url}).status_code

    with ThreadPoolExecutor(len(urls)) as pool:
        statuses = list(pool.map(racer, urls))
    assert sorted(statuses[:6]) == [200] + [409] * 5 and sorted(statuses[6:]) == [200, 409]
    winner = urls[statuses.index(200)]
    assert functions(server)["charge"]["config"]["serve_url"] == winner
    assert sorted(a["url"] for a in apps(server)) == sorted([winner, urls[6 + statuses[6:].index(200)]])


def test_a_store_fault_at_the_sync_commit_is_all_or_nothing_and_a_retry_settles_it(
    server: Live, endpoint: Callable[[Asgi], Endpoint]
) -> None:
    url = endpoint(serving("charge", "ship")).url
    with faults.inject("registration.op", "before") as plan:
        response = sync(server, url)
    assert plan.injected and response.status_code == 503, response.text
    assert functions(server) == {} and apps(server) == []
    with faults.inject("registration.op", "after") as plan:  # committed, but the server cannot know
        response = sync(server, url)
    assert plan.injected and response.status_code == 503
    assert set(functions(server)) == {"charge", "ship"} and len(apps(server)) == 1
    assert sync(server, url).status_code == 200  # the retry changes nothing but the sync time
    [listed] = apps(server)
    assert listed["functions"] == ["charge", "ship"] and listed["error"] is None
