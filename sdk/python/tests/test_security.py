"""The SDK and the service against a hostile local user: an impostor on a dead service's port
never receives the token, and requests a web page could send (CSRF, DNS rebinding) are refused."""

import socket
import threading
from pathlib import Path

import httpx
import pytest

from branchbox import Sandbox
from branchbox.exceptions import AuthenticationError


def impostor():
    """A plain TCP listener that answers every request `200 []` and keeps what it was sent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    seen = bytearray()

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(4096)
                    except OSError:
                        break
                    if not chunk:
                        break
                    buf += chunk
                seen.extend(buf)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                             b"connection: close\r\n\r\n[]")

    threading.Thread(target=serve, daemon=True).start()
    return srv, seen


def data_dir_with(tmp_path: Path, url: str, token: str) -> Path:
    service = tmp_path / "data" / "service"
    service.mkdir(parents=True)
    (service / "url").write_text(url + "\n")
    (service / "token").write_text(token + "\n")
    (service / "token").chmod(0o600)
    return service.parent


def test_a_token_from_the_data_directory_never_reaches_an_impostor(tmp_path, monkeypatch):
    token = "bbx_python_impostor_secret_0123456789"
    srv, seen = impostor()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        monkeypatch.setenv("BRANCHBOX_DATA", str(data_dir_with(tmp_path, url, token)))
        monkeypatch.delenv("BRANCHBOX_URL", raising=False)
        monkeypatch.delenv("BRANCHBOX_TOKEN", raising=False)
        with pytest.raises(AuthenticationError, match="did not prove it is the branchbox service"):
            Sandbox.list()
    finally:
        srv.close()
    assert b"/v1/auth/challenge" in seen
    assert token.encode() not in bytes(seen)


def test_a_token_from_the_data_directory_is_used_once_the_service_proves_itself(service, monkeypatch):
    monkeypatch.setenv("BRANCHBOX_DATA", str(service.data_dir))
    monkeypatch.delenv("BRANCHBOX_URL", raising=False)
    monkeypatch.delenv("BRANCHBOX_TOKEN", raising=False)
    assert isinstance(Sandbox.list(metadata={"group": "nobody-has-this"}), list)


def test_requests_a_web_page_could_send_are_refused(service):
    with httpx.Client(base_url=service.url, headers=service.headers(), timeout=60) as c:
        r = c.post("/v1/sandboxes", content=b"{}", headers={"content-type": "text/plain"})
        assert (r.status_code, r.json()["error"]["code"]) == (415, "unsupported_media_type")
        r = c.get("/v1/sandboxes", headers={"host": f"rebound.example:{service.port}"})
        assert (r.status_code, r.json()["error"]["code"]) == (403, "host_not_allowed")
        r = c.get("/v1/sandboxes", headers={"origin": "http://evil.example"})
        assert (r.status_code, r.json()["error"]["code"]) == (403, "origin_not_allowed")
        assert c.get("/v1/sandboxes").status_code == 200


def test_an_agent_that_stops_answering_frees_its_worker(workdir):
    """A frozen agent: the call fails after the stall limit instead of holding a service worker
    until the 600 s request limit (the client's own timeout is far below that)."""
    import os
    import subprocess
    import time

    from conftest import _serve

    with _serve(workdir, "stall", "--agent-stall", "2") as svc, svc.client() as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        runsc = [os.environ.get("BRANCHBOX_RUNSC", "runsc"), "--root", str(svc.data_dir / "runsc")]
        # Frozen behind the service's back: the shim still accepts, the agent never answers.
        subprocess.run([*runsc, "pause", f"{sid}-g1"], check=True)
        try:
            started = time.monotonic()
            r = c.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/"}, timeout=120)
            waited = time.monotonic() - started
            assert (r.status_code, r.json()["error"]["code"]) == (502, "agent_unavailable"), r.text
            # The service's --agent-stall (2 s here) bounds the wait, not the agent client's
            # own 60 s default (which it once did: the client reset the socket's timeout).
            assert waited < 30, f"the stall limit of 2 s was not applied: {waited:.1f} s"
        finally:
            subprocess.run([*runsc, "resume", f"{sid}-g1"], check=True)
        assert c.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/"}).status_code == 200
