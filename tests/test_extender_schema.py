"""Schemathesis against the extender's own OpenAPI schema, served by real uvicorn on loopback.

Positive cases (bodies valid per the schema) must get a documented status and a body that matches the documented
reply; negative cases (bodies that break the schema) must never get a 5xx. Kept small: a few dozen examples per
operation.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gnnsched.extender.server import ExtenderOptions, build_app
from gnnsched.extender.testing import LoopbackServer


@pytest.fixture(scope="module")
def api_schema():
    app = build_app(ExtenderOptions(fake_cluster="20x2"))
    with LoopbackServer(app) as srv:
        yield schemathesis.openapi.from_url(f"{srv.url}/openapi.json")


def _post_operations(api_schema) -> list:
    ops = [r.ok() for r in api_schema.get_all_operations()]
    posts = [op for op in ops if op.method.upper() == "POST"]
    assert {op.path for op in posts} == {"/filter", "/prioritize", "/bind"}
    return posts


# Schemathesis' pytest plugin does not load under pytest 9 here, so the strategies are driven with Hypothesis
# directly (same cases, same checks).
@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
def test_valid_requests_get_documented_replies(api_schema, path: str) -> None:
    (op,) = [op for op in _post_operations(api_schema) if op.path == path]
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

    @given(case=op.as_strategy(GenerationMode.POSITIVE))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        case.call_and_validate(checks=checks)

    run()


@pytest.mark.parametrize("path", ["/filter", "/prioritize", "/bind"])
def test_invalid_requests_never_5xx(api_schema, path: str) -> None:
    (op,) = [op for op in _post_operations(api_schema) if op.path == path]

    @given(case=op.as_strategy(GenerationMode.NEGATIVE))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case) -> None:
        response = case.call()
        assert response.status_code < 500, response.text

    run()
