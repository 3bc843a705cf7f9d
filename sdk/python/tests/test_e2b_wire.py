"""E2B's own Python SDK (the `e2b` package, pinned in requirements-test.txt) against branchboxd's
E2B wire API (docs/e2b.md), configured only as an E2B user would: E2B_API_URL, E2B_SANDBOX_URL
and E2B_API_KEY. Real gVisor sandboxes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")


def _urls(service) -> dict:
    return {
        "E2B_API_URL": f"{service.url}/e2b",
        "E2B_SANDBOX_URL": f"{service.url}/e2b/envd",
        "E2B_API_KEY": service.token,
    }


@pytest.fixture
def e2b_env(service, monkeypatch):
    """Only what an E2B user sets; nothing of branchbox's own configuration."""
    for k in list(os.environ):
        if k.startswith(("BRANCHBOX_", "E2B_")):
            monkeypatch.delenv(k, raising=False)
    for k, v in _urls(service).items():
        monkeypatch.setenv(k, v)
    return service


@pytest.fixture
def esbx(e2b_env):
    s = e2b.Sandbox.create(timeout=600)
    yield s
    s.kill()


def test_create_run_and_kill_in_a_process_with_only_e2b_settings(service, tmp_path):
    """The SDK in a fresh interpreter whose environment holds only E2B's three variables."""
    script = tmp_path / "flow.py"
    script.write_text(textwrap.dedent("""
        from e2b import Sandbox
        sbx = Sandbox.create()
        r = sbx.commands.run("echo hello from $(whoami) in $PWD")
        print(r.stdout.strip())
        sbx.kill()
    """))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_urls(service)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "hello from user in /home/user"


def test_commands_foreground_streaming_and_exit_codes(esbx):
    r = esbx.commands.run("echo out; echo err >&2; echo $FOO", envs={"FOO": "bar"})
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\nbar\n", "err\n")

    seen = []
    r = esbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", on_stdout=seen.append)
    assert "".join(seen) == "line1\nline2\nline3\n" and len(seen) >= 2

    with pytest.raises(e2b.CommandExitException) as ei:
        esbx.commands.run("echo nope >&2; exit 3")
    assert (ei.value.exit_code, ei.value.stderr) == (3, "nope\n")

    assert esbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert esbx.commands.run("whoami", user="root").stdout == "root\n"

    with pytest.raises(e2b.TimeoutException):
        esbx.commands.run("sleep 30", timeout=2)


def test_background_command_handle_waits_for_its_result(esbx):
    h = esbx.commands.run("sleep 0.5; echo done", background=True)
    assert h.wait().stdout == "done\n"


def test_files_write_read_list_and_filesystem_calls(esbx):
    info = esbx.files.write("notes/plan.txt", "step 1\n")
    assert info.path == "/home/user/notes/plan.txt"
    assert esbx.files.read("notes/plan.txt") == "step 1\n"
    blob = bytes(range(256)) * 1000
    esbx.files.write("/tmp/blob.bin", blob)
    assert bytes(esbx.files.read("/tmp/blob.bin", format="bytes")) == blob
    # Written as the user: the command, as the user, can change it.
    assert esbx.commands.run("echo more >> notes/plan.txt && stat -c %U notes/plan.txt").stdout == "user\n"

    names = {e.name: e for e in esbx.files.list("/home/user/notes")}
    assert set(names) == {"plan.txt"}
    assert names["plan.txt"].type == e2b.FileType.FILE and names["plan.txt"].size == len("step 1\nmore\n")

    assert esbx.files.exists("notes/plan.txt") and not esbx.files.exists("notes/none.txt")
    assert esbx.files.make_dir("/tmp/d/e") is True
    assert esbx.files.make_dir("/tmp/d/e") is False
    esbx.files.rename("notes/plan.txt", "notes/done.txt")
    assert esbx.files.get_info("notes/done.txt").type == e2b.FileType.FILE
    deep = {e.path for e in esbx.files.list("/tmp/d", depth=2)}
    assert deep == {"/tmp/d/e"}
    esbx.files.remove("notes")
    assert not esbx.files.exists("notes")
    with pytest.raises(e2b.FileNotFoundException):
        esbx.files.read("notes/done.txt")


def test_lifecycle_list_get_timeout_pause_connect_kill(e2b_env):
    sbx = e2b.Sandbox.create(timeout=300, metadata={"suite": "e2b-wire"})
    try:
        listed = {s.sandbox_id: s for s in e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": "e2b-wire"})).next_items()}
        assert sbx.sandbox_id in listed and listed[sbx.sandbox_id].metadata == {"suite": "e2b-wire"}
        info = sbx.get_info()
        assert info.template_id == "base" and info.sandbox_id == sbx.sandbox_id
        before = info.end_at
        sbx.set_timeout(900)
        assert sbx.get_info().end_at > before
        assert sbx.is_running()

        sbx.pause()
        assert sbx.get_info().state == e2b.SandboxState.PAUSED
        again = e2b.Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("echo back").stdout == "back\n"
    finally:
        assert sbx.kill() is True
    assert e2b.Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(e2b.SandboxNotFoundException):
        e2b.Sandbox.connect(sbx.sandbox_id)


def test_a_wrong_key_and_a_foreign_sandbox_token_are_refused(e2b_env, esbx, monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", "not-the-token-0123456789")
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.create()
    # The data plane: another sandbox's access token does not open this one.
    base = f"{e2b_env.url}/e2b/envd"
    other = httpx.post(f"{e2b_env.url}/e2b/sandboxes", headers={"x-api-key": e2b_env.token}, json={"templateID": "base"})
    assert other.status_code == 201, other.text
    o = other.json()
    try:
        r = httpx.post(
            f"{base}/filesystem.Filesystem/Stat",
            headers={"e2b-sandbox-id": esbx.sandbox_id, "x-access-token": o["envdAccessToken"]},
            json={"path": "/"},
        )
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        r = httpx.post(
            f"{base}/filesystem.Filesystem/Stat",
            headers={"e2b-sandbox-id": o["sandboxID"], "x-access-token": o["envdAccessToken"]},
            json={"path": "/"},
        )
        assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    finally:
        httpx.delete(f"{e2b_env.url}/e2b/sandboxes/{o['sandboxID']}", headers={"x-api-key": e2b_env.token})


def test_hostile_connect_requests_get_typed_errors(e2b_env, esbx):
    h = {"e2b-sandbox-id": esbx.sandbox_id, "x-api-key": e2b_env.token}
    base = f"{e2b_env.url}/e2b/envd"
    # Unknown sandbox, malformed id, no id.
    r = httpx.post(f"{base}/process.Process/List", headers={**h, "e2b-sandbox-id": "sbx-00000000000000ff"}, json={})
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    r = httpx.post(f"{base}/process.Process/List", headers={**h, "e2b-sandbox-id": "../x"}, json={})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(f"{base}/process.Process/List", headers={"x-api-key": e2b_env.token}, json={})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    # Bad protobuf and bad JSON.
    r = httpx.post(f"{base}/filesystem.Filesystem/Stat", headers={**h, "content-type": "application/proto"}, content=b"\x0a\xff")
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(f"{base}/filesystem.Filesystem/Stat", headers={**h, "content-type": "application/json"}, content=b"{\"path\": 5}")
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    # A streaming call whose envelope announces more than the limit, or lies about its length:
    # HTTP 200 with the error in the end-of-stream message.
    for body in (b"\x00\xff\xff\xff\xff", b"\x00\x00\x00\x00\x10{}", b"\x01\x00\x00\x00\x02{}"):
        r = httpx.post(f"{base}/process.Process/Start", headers={**h, "content-type": "application/connect+json"}, content=body)
        assert r.status_code == 200 and r.content[0] == 2, r.content
        assert httpx.Response(200, content=r.content[5:]).json()["error"]["code"] in (
            "resource_exhausted", "invalid_argument", "unimplemented")
    # An oversize unary body.
    r = httpx.post(f"{base}/filesystem.Filesystem/Stat", headers={**h, "content-type": "application/json"}, content=b" " * (300 * 1024))
    assert (r.status_code, r.json()["code"]) == (429, "resource_exhausted")
    # Methods not served say so.
    r = httpx.post(f"{base}/process.Process/SendInput", headers={**h, "content-type": "application/json"}, content=b"{}")
    assert (r.status_code, r.json()["code"]) == (501, "unimplemented")
