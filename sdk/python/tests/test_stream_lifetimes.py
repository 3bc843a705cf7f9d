"""Long-lived streams end with their client and with the service (issue 27, H1 and L3): a client
holding one sandbox's access token opens envd streams (`Start` of a quiet process, `WatchDir` of
a quiet directory) and drops them; the service must not keep a thread per dropped stream, must
keep answering everyone else, must bound the streams one sandbox holds open, and must stop on
SIGTERM whatever streams are open. Spoken as raw HTTP/1.1 on sockets, so the test decides
exactly when a connection goes. Real gVisor sandboxes, on a service of the module's own (it is
stopped by one test)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, List, Tuple

import httpx
import pytest

from conftest import Service, _serve

# branchboxd's drain after SIGTERM (main.rs `DRAIN`): the grace within which it must be gone.
GRACE_S = 10
# How many streams a sandbox may hold open at once (streams.rs, `Kind::Follow`).
PER_SANDBOX = 64


@pytest.fixture(scope="module")
def svc(workdir: Path) -> Iterator[Service]:
    with _serve(workdir, "streams") as s:
        # The first sandbox may build the image: not part of any test's time.
        with s.client() as c:
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            c.delete(f"/v1/sandboxes/{r.json()['id']}")
        yield s


def e2b_sandbox(svc: Service) -> Tuple[str, str]:
    """A sandbox made through E2B's REST API: its id and its access token."""
    r = httpx.post(f"{svc.url}/e2b/sandboxes", headers={"x-api-key": svc.token}, json={"templateID": "base", "timeout": 900}, timeout=120)
    assert r.status_code == 201, r.text
    o = r.json()
    return o["sandboxID"], o["envdAccessToken"]


def kill(svc: Service, box: Tuple[str, str]) -> None:
    """Kills the sandbox; one the service cannot answer for now (stopped by the test, or out
    of threads) is left to the module's service, which kills what is left when it ends."""
    if svc.proc is not None:
        try:
            httpx.delete(f"{svc.url}/e2b/sandboxes/{box[0]}", headers={"x-api-key": svc.token}, timeout=30)
        except httpx.TimeoutException:
            pass


@pytest.fixture
def box(svc: Service) -> Iterator[Tuple[str, str]]:
    b = e2b_sandbox(svc)
    yield b
    kill(svc, b)


@pytest.fixture
def boxes(svc: Service) -> Iterator[List[Tuple[str, str]]]:
    """Eight sandboxes: a spawn's cost grows with the processes its sandbox already runs, so
    the quiet processes are spread."""
    bs = [e2b_sandbox(svc) for _ in range(8)]
    yield bs
    for b in bs:
        kill(svc, b)


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def envelope(obj) -> bytes:
    b = json.dumps(obj).encode()
    return b"\x00" + len(b).to_bytes(4, "big") + b


def request(svc: Service, method: str, path: str, headers: dict, body: bytes = b"", timeout: float = 10) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", svc.port), timeout=timeout)
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{svc.port}\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s.sendall(head.encode() + body)
    return s


def read_until(s: socket.socket, marks: List[bytes], what: str) -> bytes:
    """Reads until one of `marks` arrives; fails the test when the service stays silent."""
    buf = b""
    while not any(m in buf for m in marks):
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            pytest.fail(f"{what}: nothing within {s.gettimeout()} s (got {buf[:300]!r})")
        if not chunk:
            break
        buf += chunk
    return buf


def envd_stream(svc: Service, box: Tuple[str, str], method: str, msg: dict, extra: dict = {}) -> Tuple[socket.socket, bytes]:
    """Opens envd stream `method`, reads up to its first event (or its end-of-stream error)."""
    sid, token = box
    h = {"content-type": "application/connect+json", "e2b-sandbox-id": sid, "x-access-token": token, **extra}
    s = request(svc, "POST", f"/e2b/envd/{method}", h, envelope(msg))
    return s, read_until(s, [b'"start"', b'"error"'], method)


QUIET_PROCESS = {"process": {"cmd": "/bin/sleep", "args": ["600"]}}
# The process's own timeout: whatever the test does, the sleeps go within two minutes.
BOUNDED = {"connect-timeout-ms": "120000"}


def test_dropped_start_and_watchdir_streams_free_their_threads_and_the_service_answers(svc, boxes):
    pid = svc.proc.pid
    # One stream first, so the pool threads any first request starts are in the baseline.
    s, got = envd_stream(svc, boxes[0], "filesystem.Filesystem/WatchDir", {"path": "/tmp"})
    s.close()
    time.sleep(1)
    before = threads(pid)

    def open_and_drop(i: int) -> None:
        method, msg, extra = (
            ("process.Process/Start", QUIET_PROCESS, BOUNDED),
            ("filesystem.Filesystem/WatchDir", {"path": "/tmp"}, {}),
        )[i % 2]
        s, got = envd_stream(svc, boxes[i // 2 % len(boxes)], method, msg, extra)
        s.close()
        assert b'"start"' in got, f"stream {i} of {method}: {got[:300]!r}"

    # A few clients at once, as an impatient one would (and to keep the test short).
    pool = ThreadPoolExecutor(8)
    try:
        list(pool.map(open_and_drop, range(600)))
    finally:
        pool.shutdown(cancel_futures=True)
    t = time.monotonic()
    r = httpx.get(f"{svc.url}/v1/sandboxes", headers=svc.headers(), timeout=5)
    took = time.monotonic() - t
    assert r.status_code == 200 and took < 1.0, (r.status_code, took)
    deadline = time.monotonic() + 15
    while threads(pid) > before + 16 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert threads(pid) <= before + 16, f"{threads(pid)} threads after 600 dropped streams, {before} before"


def test_dropped_streams_of_quiet_commands_and_processes_free_their_threads(svc, box):
    """branchbox's own streams: a streamed command, a background process's output and a
    directory watch, each dropped by its client while nothing happens."""
    sid, _ = box
    pid = svc.proc.pid
    bearer = {"authorization": f"Bearer {svc.token}"}
    with svc.client() as c:
        bg = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "sleep 600", "timeout": 120}).json()["pid"]
    s = request(svc, "GET", f"/v1/sandboxes/{sid}/files/watch?path=/tmp", bearer)
    read_until(s, [b"event: ready"], "directory watch")
    s.close()
    time.sleep(1)
    before = threads(pid)
    body = json.dumps({"cmd": "sleep 120", "timeout": 120}).encode()
    for i in range(30):
        s = request(svc, "POST", f"/v1/sandboxes/{sid}/commands/stream", {**bearer, "content-type": "application/json"}, body)
        read_until(s, [b"200 OK"], f"streamed command {i}")
        s.close()
        s = request(svc, "GET", f"/v1/sandboxes/{sid}/processes/{bg}/output", bearer)
        read_until(s, [b"200 OK"], f"process output {i}")
        s.close()
        s = request(svc, "GET", f"/v1/sandboxes/{sid}/files/watch?path=/tmp", bearer)
        read_until(s, [b"event: ready"], f"directory watch {i}")
        s.close()
    deadline = time.monotonic() + 15
    while threads(pid) > before + 16 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert threads(pid) <= before + 16, f"{threads(pid)} threads after 90 dropped streams, {before} before"


def test_one_sandbox_holds_a_bounded_number_of_streams_and_others_still_get_theirs(svc, box):
    held = []
    try:
        for i in range(PER_SANDBOX):
            s, got = envd_stream(svc, box, "filesystem.Filesystem/WatchDir", {"path": "/tmp"})
            held.append(s)
            assert b'"start"' in got, f"stream {i}: {got[:300]!r}"
        s, got = envd_stream(svc, box, "process.Process/Start", QUIET_PROCESS, BOUNDED)
        held.append(s)
        assert b'"resource_exhausted"' in got and b"in this sandbox" in got, got[:300]
        # The refusal started nothing, and the service answers everyone else.
        r = httpx.get(f"{svc.url}/v1/sandboxes", headers=svc.headers(), timeout=5)
        assert r.status_code == 200
        with svc.client() as c:
            r = c.get(f"/v1/sandboxes/{box[0]}/processes")
            assert r.status_code == 200 and not r.json(), r.text
            other = c.post("/v1/sandboxes", json={}).json()["id"]
            with c.stream("GET", f"/v1/sandboxes/{other}/files/watch", params={"path": "/tmp"}) as w:
                assert w.status_code == 200
            c.delete(f"/v1/sandboxes/{other}")
    finally:
        for s in held:
            s.close()
    # Closed, their places come back: the sandbox opens streams again.
    deadline = time.monotonic() + 5
    while True:
        s, got = envd_stream(svc, box, "filesystem.Filesystem/WatchDir", {"path": "/tmp"})
        s.close()
        if b'"start"' in got or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert b'"start"' in got, got[:300]


def test_sigterm_stops_the_service_within_its_grace_whatever_streams_are_open(svc, box):
    sid, _ = box
    held = [envd_stream(svc, box, "process.Process/Start", QUIET_PROCESS, BOUNDED)[0] for _ in range(4)]
    held += [envd_stream(svc, box, "filesystem.Filesystem/WatchDir", {"path": "/tmp"})[0] for _ in range(4)]
    bearer = {"authorization": f"Bearer {svc.token}"}
    with svc.client() as c:
        bg = c.post(f"/v1/sandboxes/{sid}/processes", json={"cmd": "sleep 600", "timeout": 120}).json()["pid"]

    w = httpx.post(f"{svc.url}/e2b/envd/filesystem.Filesystem/CreateWatcher", headers={"e2b-sandbox-id": sid, "x-access-token": box[1]}, json={"path": "/tmp"})
    assert w.status_code == 200, w.text
    s = request(svc, "GET", f"/v1/sandboxes/{sid}/processes/{bg}/output", bearer)
    read_until(s, [b"200 OK"], "process output")
    held.append(s)
    s = request(svc, "GET", f"/v1/sandboxes/{sid}/files/watch?path=/tmp", bearer)
    read_until(s, [b"event: ready"], "directory watch")
    held.append(s)
    key = base64.b64encode(os.urandom(16)).decode()
    ws = {"connection": "Upgrade", "upgrade": "websocket", "sec-websocket-version": "13", "sec-websocket-key": key, **bearer}
    s = request(svc, "GET", f"/v1/sandboxes/{sid}/pty?cmd=sleep%20600", ws)
    read_until(s, [b"101 Switching Protocols"], "terminal")
    held.append(s)
    t = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    try:
        svc.proc.wait(timeout=GRACE_S)
    except Exception:
        svc.proc.kill()
        svc.proc.wait()
        pytest.fail(f"branchboxd was still running {GRACE_S} s after SIGTERM with streams open")
    finally:
        for s in held:
            s.close()
        svc.proc = None
    assert time.monotonic() - t < GRACE_S
