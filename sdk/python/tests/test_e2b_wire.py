"""E2B's own Python SDK (the `e2b` package, pinned in requirements-test.txt) against branchboxd's
E2B wire API (docs/e2b.md), configured only as an E2B user would: E2B_API_URL, E2B_SANDBOX_URL
and E2B_API_KEY. Real gVisor sandboxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

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
    assert h.pid > 1
    assert h.wait().stdout == "done\n"


def test_background_commands_list_connect_stdin_and_kill(esbx):
    # The start event carries the real pid: the command sees it as its own.
    h = esbx.commands.run("echo $$ > /tmp/pid; exec sleep 60", background=True, timeout=0)
    for _ in range(100):
        if esbx.files.exists("/tmp/pid") and esbx.files.read("/tmp/pid"):
            break
        time.sleep(0.1)
    assert esbx.files.read("/tmp/pid") == f"{h.pid}\n"
    listed = {p.pid: p for p in esbx.commands.list()}
    assert h.pid in listed and listed[h.pid].cmd == "/bin/bash"
    # Reading again by pid: output from now on, then the end.
    again = esbx.commands.connect(h.pid)
    assert again.pid == h.pid
    assert esbx.commands.kill(h.pid) is True
    with pytest.raises(e2b.CommandExitException) as ei:
        again.wait()
    assert ei.value.exit_code == -1
    with pytest.raises(e2b.CommandExitException):
        h.wait()
    assert esbx.commands.kill(h.pid) is False
    assert h.pid not in {p.pid for p in esbx.commands.list()}

    # stdin: kept open when asked for, closed (end of file) by close_stdin.
    cat = esbx.commands.run("cat", background=True, stdin=True)
    esbx.commands.send_stdin(cat.pid, "one\n")
    esbx.commands.send_stdin(cat.pid, b"two\n")
    esbx.commands.stream_input(cat.pid, ["thr", "ee\n"])
    esbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "one\ntwo\nthree\n"
    # Without stdin the command reads end of file at once.
    assert esbx.commands.run("cat; echo eof").stdout == "eof\n"

    # handle.kill() ends it; a dropped handle leaves it running (as envd does).
    h = esbx.commands.run("sleep 60", background=True)
    assert h.kill() is True
    h = esbx.commands.run("sleep 60", background=True, timeout=0)
    h.disconnect()
    assert h.pid in {p.pid for p in esbx.commands.list()}
    assert esbx.commands.kill(h.pid) is True

    # Early output is not lost to the start.
    assert esbx.commands.run("echo first; echo err >&2").stdout == "first\n"
    r = esbx.commands.run("printf 'a!b' >&2; printf x")
    assert (r.stdout, r.stderr) == ("x", "a!b")


def test_terminals_create_type_resize_and_kill(esbx):
    out = bytearray()
    t = esbx.pty.create(e2b.PtySize(rows=24, cols=80), timeout=0)
    assert t.pid > 1 << 22
    assert t.pid in {p.pid for p in esbx.commands.list()}
    esbx.pty.send_stdin(t.pid, b"stty size; echo mark$((6*7))\n")
    esbx.pty.resize(t.pid, e2b.PtySize(rows=30, cols=100))
    esbx.pty.send_stdin(t.pid, b"stty size; exit 0\n")
    r = t.wait(on_pty=lambda d: out.extend(d))
    text = out.decode(errors="replace")
    assert "mark42" in text and "30 100" in text, text
    assert r.exit_code == 0

    t = esbx.pty.create(e2b.PtySize(rows=24, cols=80))
    assert esbx.pty.kill(t.pid) is True
    with pytest.raises(e2b.CommandExitException):
        t.wait()
    assert t.pid not in {p.pid for p in esbx.commands.list()}
    with pytest.raises(e2b.SandboxException):
        esbx.pty.resize(t.pid, e2b.PtySize(rows=1, cols=1))


def test_watch_dir_sync_polls_events(esbx):
    esbx.files.make_dir("w")
    w = esbx.files.watch_dir("w", recursive=True)
    esbx.files.write("w/a.txt", "x")
    esbx.commands.run("mkdir -p w/sub && echo y > w/sub/b.txt && rm w/a.txt")
    seen = set()
    for _ in range(50):
        seen |= {(e.name, e.type) for e in w.get_new_events()}
        if ("sub/b.txt", e2b.FilesystemEventType.WRITE) in seen and ("a.txt", e2b.FilesystemEventType.REMOVE) in seen:
            break
        time.sleep(0.1)
    assert ("a.txt", e2b.FilesystemEventType.CREATE) in seen, seen
    assert ("sub/b.txt", e2b.FilesystemEventType.WRITE) in seen, seen
    assert ("a.txt", e2b.FilesystemEventType.REMOVE) in seen, seen
    w.stop()
    with pytest.raises(e2b.SandboxException):
        w.get_new_events()


def test_watch_dir_async_streams_events(e2b_env):
    import asyncio

    async def flow():
        sbx = await e2b.AsyncSandbox.create(timeout=300)
        try:
            got = asyncio.Queue()
            h = await sbx.files.watch_dir("/tmp", on_event=got.put_nowait)
            await sbx.files.write("/tmp/hello.txt", "hi")
            names = set()
            while ("hello.txt", e2b.FilesystemEventType.WRITE) not in names:
                e = await asyncio.wait_for(got.get(), 20)
                names.add((e.name, e.type))
            await h.stop()
            with pytest.raises(e2b.NotFoundException):
                await sbx.files.watch_dir("/tmp/none", on_event=print)
        finally:
            await sbx.kill()

    asyncio.run(flow())


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
    assert sbx.is_running() is False
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
    # Input, signals, resizes and watchers for what is not there, or not this sandbox's.
    j = {**h, "content-type": "application/json"}
    r = httpx.post(f"{base}/process.Process/SendInput", headers=j, json={"process": {"pid": 999999}, "input": {"stdin": "eA=="}})
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    r = httpx.post(f"{base}/process.Process/SendInput", headers=j, json={"process": {"pid": 1}})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(f"{base}/process.Process/SendInput", headers=j, json={"process": {"pid": 0}, "input": {"stdin": "eA=="}})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(f"{base}/process.Process/CloseStdin", headers=j, json={"process": {"tag": "x"}})
    assert (r.status_code, r.json()["code"]) == (501, "unimplemented")
    r = httpx.post(f"{base}/process.Process/Update", headers=j, json={"process": {"pid": 5}, "pty": {"size": {"cols": 0, "rows": 5}}})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = httpx.post(f"{base}/process.Process/Update", headers=j, json={"process": {"pid": 5}, "pty": {"size": {"cols": 80, "rows": 24}}})
    assert (r.status_code, r.json()["code"]) == (404, "not_found")
    for wid in ("", "nope", "../../x" * 100):
        r = httpx.post(f"{base}/filesystem.Filesystem/GetWatcherEvents", headers=j, json={"watcherId": wid})
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
    r = httpx.post(f"{base}/filesystem.Filesystem/CreateWatcher", headers=j, json={"path": "/etc/hostname"})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    # A watcher opens only in its own sandbox.
    r = httpx.post(f"{base}/filesystem.Filesystem/CreateWatcher", headers=j, json={"path": "/tmp"})
    wid = r.json()["watcherId"]
    other = e2b.Sandbox.create()
    try:
        r = httpx.post(f"{base}/filesystem.Filesystem/GetWatcherEvents", headers={**j, "e2b-sandbox-id": other.sandbox_id}, json={"watcherId": wid})
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
    finally:
        other.kill()
    assert httpx.post(f"{base}/filesystem.Filesystem/RemoveWatcher", headers=j, json={"watcherId": wid}).status_code == 200
    # Streams: a terminal of impossible size, a Connect to no process, a StreamInput that lies.
    s = {**h, "content-type": "application/connect+json"}

    def env(obj):
        b = json.dumps(obj).encode()
        return b"\x00" + len(b).to_bytes(4, "big") + b

    def end_code(r):
        assert r.status_code == 200 and r.content, r.text
        i = 0
        while i < len(r.content):
            flags, n = r.content[i], int.from_bytes(r.content[i + 1 : i + 5], "big")
            if flags & 2:
                return (json.loads(r.content[i + 5 : i + 5 + n]).get("error") or {}).get("code")
            i += 5 + n
        return None

    r = httpx.post(f"{base}/process.Process/Start", headers=s, content=env({"process": {"cmd": "/bin/sh"}, "pty": {"size": {"cols": 5000, "rows": 1}}}))
    assert end_code(r) == "invalid_argument"
    r = httpx.post(f"{base}/process.Process/Connect", headers=s, content=env({"process": {"pid": 999999}}))
    assert end_code(r) == "not_found"
    r = httpx.post(f"{base}/process.Process/StreamInput", headers=s, content=env({"data": {"input": {"stdin": "eA=="}}}))
    assert end_code(r) == "invalid_argument"
    r = httpx.post(f"{base}/process.Process/StreamInput", headers=s, content=env({"start": {"process": {"pid": 999999}}}) + b"\x00\x00\x00")
    assert end_code(r) == "invalid_argument"
    r = httpx.post(f"{base}/process.Process/StreamInput", headers=s, content=b"\x00\xff\xff\xff\xff")
    assert end_code(r) == "resource_exhausted"
    r = httpx.post(f"{base}/filesystem.Filesystem/WatchDir", headers=s, content=env({"path": "/nonexistent"}))
    assert end_code(r) == "not_found"
