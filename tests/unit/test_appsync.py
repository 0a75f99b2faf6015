"""The checks of ``appsync`` without a network or database: which URLs are
accepted, which owners conflict, and descriptions rebuilt as decoration checks
them (``catalog.rebuild``), so a bad one is refused whole, naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import stepstone as ss
from stepstone.appsync import check_url, conflicts, function_configs, served_from
from stepstone.catalog import rebuild
from stepstone.errors import ConfigError, EndpointError
from stepstone.introspection import AppDocument, AppDocumentError, describe_app
from stepstone.store.viewrows import AppRow

URL = "https://shop.example.com/api/stepstone"


def test_urls_are_absolute_http_with_a_host_and_nothing_hidden() -> None:
    assert check_url(f"  {URL} ") == URL
    assert check_url("http://127.0.0.1:8000/x?region=eu") == "http://127.0.0.1:8000/x?region=eu"
    for bad in (
        None,
        3,
        "",
        "/relative",
        "ftp://h/",
        "http://",
        "http://h/#f",
        "http://u@h/",
        "http://h:0x/",
        "http://h/a b",
    ):
        with pytest.raises(ConfigError) as caught:
            check_url(bad)
        assert caught.value.field == "url"


def _doc(*descriptions: dict[str, Any]) -> AppDocument:
    return AppDocument(app="front", app_version=None, max_duration=60.0, functions=tuple(descriptions))


def test_each_description_is_rebuilt_and_carries_its_serve_url() -> None:
    app = ss.App("front", database_url="sqlite:///never-opened.db")
    app.function(id="charge", trigger=ss.on_event("order"), concurrency=ss.Concurrency(limit=3))(
        lambda ctx: None
    )
    document = describe_app("front", app.registry, app_version=None, max_duration=60)
    configs = function_configs(URL, document)
    assert list(configs) == ["charge"] and served_from(configs["charge"]) == URL
    assert rebuild(json.loads(configs["charge"])).flow == app.registry.get("charge").flow  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("description", "named"),
    [
        ({"id": "f", "retries": -1}, "retries"),
        ({"id": "f", "retries": "many"}, "retries"),
        ({"id": "f", "triggers": [{"cron": "every day"}]}, "f"),
        ({"id": "f", "triggers": ["order"]}, "f"),
        ({"id": "f", "concurrency": {"limit": 0}}, "limit"),
    ],
)
def test_a_bad_description_is_refused_naming_its_function(description: dict[str, Any], named: str) -> None:
    good = {"id": "g", "triggers": [{"event": "x"}]}
    with pytest.raises(EndpointError, match="function '.*' has an invalid description") as caught:
        function_configs(URL, _doc(good, description))
    assert named in str(caught.value)


def test_a_function_without_an_id_is_not_an_app_document() -> None:
    raw = {"protocol": 1, "app": "a", "app_version": None, "max_duration": 60, "functions": [{"id": " "}]}
    with pytest.raises(AppDocumentError, match="non-empty 'id'"):
        AppDocument.from_json(raw)


def test_a_function_described_twice_is_refused() -> None:
    with pytest.raises(EndpointError, match="'f' twice"):
        function_configs(URL, _doc({"id": "f"}, {"id": "f"}))


def _row(url: str, app: str) -> AppRow:
    return AppRow(
        url=url, app=app, app_version=None, max_duration=60, function_ids=(), created_at=0, synced_at=0
    )


def test_ids_and_names_owned_elsewhere_conflict_and_retired_ones_do_not() -> None:
    functions = {
        "mine": ("front", json.dumps({"id": "mine", "serve_url": URL})),
        "worker": ("warehouse", json.dumps({"id": "worker"})),
        "other-url": ("back", json.dumps({"id": "other-url", "serve_url": "http://b/"})),
        "old": ("warehouse", json.dumps({"id": "old"})),
    }
    retired = {"old": 1.0}
    assert conflicts(URL, "front", ["mine", "new", "old"], functions, retired, [_row(URL, "front")]) == []
    found = conflicts(URL, "front", ["worker", "other-url"], functions, retired, [_row("http://b/", "front")])
    assert found == [
        "app 'front' is already served from http://b/",
        "function 'other-url' is already registered by app 'back' (served from http://b/)",
        "function 'worker' is already registered by app 'warehouse' (served by workers)",
    ]
    assert conflicts(URL, "warehouse", ["new"], functions, retired, []) == [
        "app name 'warehouse' is used by workers (function 'worker')"
    ]


def test_an_app_with_a_failure_handler_and_a_long_id_is_accepted_whole() -> None:
    app = ss.App("front", database_url="sqlite:///never-opened.db")
    long_id = "c" * 256
    app.function(id=long_id, trigger=ss.on_event("order"), on_failure=lambda ctx: None)(lambda ctx: None)
    document = describe_app("front", app.registry, app_version=None, max_duration=60)
    assert sorted(function_configs(URL, document)) == sorted(fn.id for fn in app.registry)
    assert len(document.functions) == 2
