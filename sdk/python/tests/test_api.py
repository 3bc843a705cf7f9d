"""The HTTP API itself: every bad input answered with the right status, code and message; no
request without a valid token succeeds; the OpenAPI document validates and matches the routes;
schemathesis finds no server error."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openapi_spec_validator import validate

NIL = "sbx-0000000000000000"


def err(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    body = r.json()["error"]
    assert body["code"] == code, body
    assert len(body["message"]) > 10, body
    return body["message"]


@pytest.fixture(scope="module")
def api(service):
    with service.client() as c:
        yield c


@pytest.fixture(scope="module")
def doc(api):
    r = api.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


@pytest.fixture
def live(api):
    sid = api.post("/v1/sandboxes", json={"timeout": 600}).json()["id"]
    yield sid
    api.delete(f"/v1/sandboxes/{sid}")


def test_openapi_document_validates(doc):
    validate(doc)
    assert doc["openapi"].startswith("3.")


def concrete(path: str) -> str:
    return path.replace("{id}", NIL).replace("{snapshot}", "snap-0000000000000000").replace("{pid}", "1").replace("{pool}", "no-such-pool")


def operations(doc):
    for path, item in doc["paths"].items():
        for method in ("get", "put", "post", "delete"):
            if method in item:
                yield path, method, item[method]


def test_every_route_but_healthz_requires_a_valid_token(service, doc):
    ops = list(operations(doc))
    assert len(ops) > 25
    bad_headers = [{}, {"authorization": "Bearer wrong-token-0123456789"}, {"authorization": f"Basic {service.token}"},
                   {"authorization": f"Bearer {service.token}x"}]
    with httpx.Client(base_url=service.url, timeout=60) as c:
        for path, method, op in ops:
            if path in ("/healthz", "/v1/auth/challenge"):
                assert op["security"] == []
                continue
            assert op["security"] == [{"bearer": []}], path
            for h in bad_headers:
                r = c.request(method.upper(), concrete(path), headers=h, json={})
                err(r, 401, "unauthorized")
        err(c.get("/openapi.json"), 401, "unauthorized")
        err(c.get("/metrics"), 401, "unauthorized")
        assert c.get("/healthz").json() == {"status": "ok"}


def test_every_documented_route_is_served_and_unknown_ones_are_not(api, doc):
    for path, method, _ in operations(doc):
        r = api.request(method.upper(), concrete(path), json={})
        if r.status_code == 404:
            assert "no such route" not in r.json()["error"]["message"], (method, path)
        assert r.status_code < 500, (method, path, r.text)
    assert "no such route" in err(api.get("/v1/nothing-here"), 404, "not_found")
    err(api.patch("/v1/sandboxes"), 405, "method_not_allowed")


def test_malformed_requests_are_400(api):
    assert "sandbox id" in err(api.get("/v1/sandboxes/not-an-id"), 400, "invalid_id")
    err(api.get("/v1/sandboxes/sbx-../../etc"), 400, "invalid_id")
    err(api.post("/v1/sandboxes", content=b"{not json", headers={"content-type": "application/json"}), 400, "bad_json")
    err(api.get("/v1/audit", params={"limit": "many"}), 400, "bad_query")
    err(api.get("/v1/snapshots/a b"), 400, "invalid_id")
    err(api.post(f"/v1/sandboxes/{NIL}/processes/-3/signal", json={"signal": 9}), 400, "invalid_id")


def test_unknown_objects_are_404(api):
    assert "GET /v1/sandboxes" in err(api.get(f"/v1/sandboxes/{NIL}"), 404, "not_found")
    err(api.delete(f"/v1/sandboxes/{NIL}"), 404, "not_found")
    err(api.post(f"/v1/sandboxes/{NIL}/commands", json={"cmd": "true"}), 404, "not_found")
    err(api.get("/v1/snapshots/snap-0000000000000000"), 404, "not_found")
    err(api.post("/v1/sandboxes", json={"snapshot_id": "no-such-snapshot"}), 404, "not_found")
    assert "template" in err(api.post("/v1/sandboxes", json={"template": "ubuntu"}), 404, "not_found")


def test_values_out_of_range_are_422(api, live):
    cases = [
        ("/v1/sandboxes", {"timeout": -1}, "timeout"),
        ("/v1/sandboxes", {"timeout": 1e12}, "timeout"),
        ("/v1/sandboxes", {"memory_mib": 1}, "memory"),
        ("/v1/sandboxes", {"envs": {"1BAD": "x"}}, "envs"),
        ("/v1/sandboxes", {"metadata": {f"k{i}": "v" for i in range(65)}}, "64"),
        ("/v1/sandboxes", {"snapshot_id": "x", "cpus": 2}, "limits"),
        (f"/v1/sandboxes/{live}/fork", {"count": 0}, "count"),
        (f"/v1/sandboxes/{live}/fork", {"count": 10_000}, "count"),
        (f"/v1/sandboxes/{live}/commands", {"cmd": "a", "argv": ["b"]}, "exactly one"),
        (f"/v1/sandboxes/{live}/commands", {}, "exactly one"),
        (f"/v1/sandboxes/{live}/commands", {"cmd": "true", "cwd": "relative"}, "absolute"),
        (f"/v1/sandboxes/{live}/processes/1/signal", {"signal": 0}, "signal"),
        (f"/v1/sandboxes/{live}/timeout", {"timeout": -1}, "timeout"),  # 0 ends it (E2B's meaning)
    ]
    for path, body, hint in cases:
        assert hint in err(api.post(path, json=body), 422, "invalid_input"), (path, body)
    # Well-formed JSON that does not fit the operation.
    assert "unknown field" in err(api.post("/v1/sandboxes", json={"tiemout": 5}), 422, "invalid_body")
    err(api.post("/v1/sandboxes", json={"timeout": "soon"}), 422, "invalid_body")
    err(api.post(f"/v1/sandboxes/{live}/timeout", json={}), 422, "invalid_body")
    err(api.put(f"/v1/sandboxes/{live}/files", params={"path": "/x", "mode": "999"}, content=b""), 422, "invalid_input")


def test_state_conflicts_are_409(api, live):
    assert api.post(f"/v1/sandboxes/{live}/pause").status_code == 200
    assert "paused" in err(api.post(f"/v1/sandboxes/{live}/commands", json={"cmd": "true"}), 409, "conflict")
    err(api.post(f"/v1/sandboxes/{live}/pause"), 409, "conflict")
    err(api.post(f"/v1/sandboxes/{live}/fork", json={}), 409, "conflict")
    assert api.post(f"/v1/sandboxes/{live}/connect", json={}).status_code == 200
    r = api.post(f"/v1/sandboxes/{live}/commands", json={"cmd": "true"})
    assert r.status_code == 200 and r.json()["exit_code"] == 0


def test_json_body_over_the_limit_is_413(api, live):
    big = {"cmd": "true", "stdin": "x" * (2 << 20)}
    assert "bytes" in err(api.post(f"/v1/sandboxes/{live}/commands", json=big), 413, "too_large")


def test_oversized_command_is_413(api, live):
    err(api.post(f"/v1/sandboxes/{live}/commands", json={"argv": ["echo", "y" * 60_000]}), 413, "too_large")


def test_file_limits_and_capacity_on_a_limited_service(limited):
    with limited.client() as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201
        sid = r.json()["id"]
        try:
            msg = err(c.post("/v1/sandboxes", json={}), 503, "at_capacity")
            assert "at most 1" in msg
            err(c.post(f"/v1/sandboxes/{sid}/fork", json={"count": 1}), 503, "at_capacity")
            # A template build starts a sandbox of its own: it is admitted against the cap too.
            err(c.post("/v1/templates", json={"name": "over-cap", "steps": [{"run": "true"}]}), 503, "at_capacity")
            two_mib = b"z" * (2 << 20)
            err(c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/a"}, content=two_mib), 413, "too_large")
            # Without a length up front (chunked), the limit is enforced while streaming.
            chunks = (two_mib[i:i + 65536] for i in range(0, len(two_mib), 65536))
            err(c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/b"}, content=chunks), 413, "too_large")
            r = c.post(f"/v1/sandboxes/{sid}/commands", json={"cmd": "head -c 2097152 /dev/zero > /tmp/big"})
            assert r.json()["exit_code"] == 0
            err(c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/big"}), 413, "too_large")
            assert c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/ok"}, content=b"fine").status_code == 200
        finally:
            c.delete(f"/v1/sandboxes/{sid}")
        assert c.post("/v1/sandboxes", json={}).status_code == 201, "capacity is freed by kill"


def test_metrics_are_prometheus_text(api):
    r = api.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert re.search(r'^branchbox_http_requests_total\{method="GET",route="/v1/sandboxes/\{id\}",status="400"\} \d+$',
                     r.text, re.M) or "branchbox_http_requests_total" in r.text
    assert re.search(r'^branchbox_sandboxes\{state="running"\} \d+$', r.text, re.M)
    assert re.search(r"^branchbox_sandboxes_max 80$", r.text, re.M)


def test_schemathesis_finds_no_server_errors_and_answers_match_the_document(service, doc, tmp_path):
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(doc))
    st = Path(sys.executable).with_name("st")
    cmd = [
        str(st), "run", str(schema), "--url", service.url,
        "-H", f"Authorization: Bearer {service.token}",
        "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        "--max-examples", os.environ.get("BRANCHBOX_SCHEMATHESIS_EXAMPLES", "8"),
        "--phases", "examples,coverage,fuzzing", "--workers", "2", "--seed", os.environ.get("BRANCHBOX_SCHEMATHESIS_SEED", "1"),
        "--request-timeout", "300", "--generation-database", "none", "--no-color",
        "--suppress-health-check", "all",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
