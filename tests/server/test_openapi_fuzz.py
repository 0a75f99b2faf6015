"""Schemathesis against the live server's OpenAPI spec: no 5xx, responses match
the documented schemas and status codes, auth is enforced where declared."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

import stepstone as ss
from stepstone.server.auth import AuthConfig
from stepstone.server.factory import create_app
from tests.server.conftest import API_KEY, Live, shop_app, start_server

# Every other check runs (no 5xx, documented statuses and content types, response
# schemas, negative data rejected, auth enforced). This one is excluded because the
# spec cannot say that a CEL expression must compile, that `since` must not be
# after `until`, or that `function_id` must name a registered function: such
# schema-valid requests get 422 on purpose.


def _cases() -> list[tuple[str, GenerationMode]]:
    """Every operation of the spec (built without a server or a database), with
    valid data, and with invalid data where it takes query parameters or a body
    (any string is a valid path parameter)."""
    url = f"sqlite:///{tempfile.mkdtemp(prefix='stepstone-spec-')}/spec.db"  # never opened
    spec = create_app(ss.App("spec", database_url=url), AuthConfig(("k",))).openapi()
    cases = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            label = f"{method.upper()} {path}"
            cases.append((label, GenerationMode.POSITIVE))
            query = [p for p in operation.get("parameters", []) if p["in"] == "query"]
            if query or operation.get("requestBody"):
                cases.append((label, GenerationMode.NEGATIVE))
    return cases


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}"
    app = shop_app(url, {"broken": True})
    live = start_server(app, workers=True)
    # something to find: completed, failed and queued runs, a job
    live.http.post(
        "/api/v1/events", json=[{"name": "hello"}, {"name": "boom"}, {"name": "hello", "id": "known"}]
    )
    live.http.post("/api/v1/runs/cancel-many", json={"function_id": "greet"})
    yield live
    live.stop()
    app.close()


@pytest.fixture(scope="module")
def api_schema(fuzzed: Live) -> Any:
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")


@pytest.mark.parametrize(("label", "mode"), _cases(), ids=lambda v: str(getattr(v, "value", v)))
def test_the_api_conforms_to_its_spec(api_schema: Any, label: str, mode: GenerationMode) -> None:
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, label

    auth = {"Authorization": f"Bearer {API_KEY}"}

    @given(case=operation.as_strategy(generation_mode=mode, headers=auth))
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def conforms(case: Any) -> None:
        case.call_and_validate(excluded_checks=[positive_data_acceptance])

    conforms()


def test_the_spec_is_versioned_and_declares_bearer_auth(fuzzed: Live) -> None:
    spec = fuzzed.http.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert {
        "/api/v1/events",
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/trace",
        "/api/v1/runs/{run_id}/cancel",
        "/api/v1/runs/{run_id}/replay",
        "/api/v1/runs/{run_id}/resume",
        "/api/v1/runs/{run_id}/rerun",
        "/api/v1/runs/cancel-many",
        "/api/v1/runs/replay-many",
        "/api/v1/runs/resume-many",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/functions",
        "/api/v1/workers",
        "/healthz",
        "/metrics",
    } <= set(spec["paths"])
    assert "security" not in spec["paths"]["/healthz"]["get"]
    assert spec["paths"]["/api/v1/runs"]["get"]["security"] == [{"bearer": []}]
    assert spec["info"]["version"]
