"""File calls act as the account they are made for (issue 27, L1), on E2B's wire and through
branchbox's SDK: the kernel in the sandbox refuses what the account's own commands would be
refused, a symlink the account planted included. Downloads of what is not a regular file are
errors, and envd uploads are bounded (M3). Real gVisor sandboxes."""

from __future__ import annotations

import select
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from branchbox import Sandbox
from branchbox.exceptions import BranchboxError, CommandExitException, PermissionDeniedError

# What crates/service/src/e2b/uploads.rs allows.
MAX_PART_HEADERS = 16 << 10
PER_SANDBOX = 8


def root(sbx: Sandbox, line: str) -> str:
    r = sbx.commands.run(line, user="root")
    assert r.exit_code == 0, r.stderr
    return r.stdout


def refused_to_user(sbx: Sandbox, line: str) -> bool:
    """True when `line` fails as the sandbox's `user`."""
    try:
        sbx.commands.run(line)
    except CommandExitException:
        return True
    return False


def plant(sbx: Sandbox) -> None:
    """What a hostile `user` does: a link from its home into /etc, and root's private file."""
    assert sbx.commands.run("ln -s /etc /home/user/cfg").exit_code == 0
    root(sbx, "mkdir -m 700 /opt/private && echo secret > /opt/private/f && rm -f /etc/ld.so.preload")


def envd(service, sbx: Sandbox) -> tuple:
    return f"{service.url}/e2b/envd", {"e2b-sandbox-id": sbx.sandbox_id, "x-api-key": service.token}


def test_an_e2b_upload_as_user_through_a_planted_symlink_cannot_make_a_file_in_etc(service, sbx):
    plant(sbx)
    base, h = envd(service, sbx)
    # No Authorization: E2B's default account, `user`.
    r = httpx.post(f"{base}/files", params={"path": "/home/user/cfg/ld.so.preload"}, headers=h,
                   files={"file": ("ld.so.preload", b"/tmp/evil.so\n")})
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied"), r.text
    assert root(sbx, "test -e /etc/ld.so.preload && echo made || echo absent") == "absent\n"
    # Where `user` may write, the file is written and is its own.
    r = httpx.post(f"{base}/files", params={"path": "/home/user/new/f"}, headers=h, files={"file": ("f", b"x")})
    assert r.status_code == 200, r.text
    assert root(sbx, "stat -c %U:%G /home/user/new /home/user/new/f") == "user:user\nuser:user\n"


def test_e2b_reads_listings_and_stats_as_user_are_refused_where_cat_and_ls_are(service, sbx):
    plant(sbx)
    base, h = envd(service, sbx)
    assert refused_to_user(sbx, "cat /opt/private/f")
    r = httpx.get(f"{base}/files", params={"path": "/opt/private/f"}, headers=h)
    assert r.status_code == 403, (r.status_code, r.text)
    r = httpx.post(f"{base}/filesystem.Filesystem/ListDir", headers=h, json={"path": "/opt/private"})
    assert (r.status_code, r.json()["code"]) == (403, "permission_denied"), r.text
    r = httpx.post(f"{base}/filesystem.Filesystem/Stat", headers=h, json={"path": "/opt/private/f"})
    assert r.status_code == 403, r.text
    r = httpx.post(f"{base}/filesystem.Filesystem/Remove", headers=h, json={"path": "/home/user/cfg/passwd"})
    assert r.status_code == 403, r.text
    # As root (envd's `Authorization: Basic root:`), the same file reads.
    r = httpx.get(f"{base}/files", params={"path": "/opt/private/f", "username": "root"}, headers=h)
    assert (r.status_code, r.text) == (200, "secret\n")


def test_the_sdks_file_calls_agree_with_its_commands_for_the_same_user(sbx):
    plant(sbx)
    # The split the review found: a write to /root succeeded, then `cat` as user was refused.
    with pytest.raises(PermissionDeniedError):
        sbx.files.write("/root/x", "x")
    assert root(sbx, "test -e /root/x && echo made || echo absent") == "absent\n"
    with pytest.raises(PermissionDeniedError):
        sbx.files.write("/home/user/cfg/ld.so.preload", "/tmp/evil.so\n")
    assert root(sbx, "test -e /etc/ld.so.preload && echo made || echo absent") == "absent\n"
    with pytest.raises(PermissionDeniedError):
        sbx.files.read("/opt/private/f")
    with pytest.raises(PermissionDeniedError):
        sbx.files.list("/opt/private")
    with pytest.raises(PermissionDeniedError):
        sbx.files.remove("/home/user/cfg/hostname")
    with pytest.raises(PermissionDeniedError):
        sbx.files.make_dir("/etc/made-by-user")
    # What user writes, user's commands read, and root may still do what root may.
    sbx.files.write("notes/a.txt", "hello")
    assert sbx.commands.run("cat /home/user/notes/a.txt; echo; stat -c %U /home/user/notes").stdout == "hello\nuser\n"
    assert sbx.files.read("/opt/private/f", user="root") == "secret\n"
    sbx.files.write("/root/x", "x", user="root")
    assert root(sbx, "stat -c %U /root/x") == "root\n"


def test_downloads_of_devices_fifos_and_proc_descriptors_are_errors_on_both_wires(service, sbx):
    root(sbx, "mkfifo -m 666 /tmp/fifo")
    base, h = envd(service, sbx)
    with httpx.Client(base_url=service.url, headers=service.headers(), timeout=30) as c:
        for path in ("/dev/zero", "/tmp/fifo", "/proc/1/fd/1"):
            t = time.monotonic()
            r = c.get(f"/v1/sandboxes/{sbx.sandbox_id}/files", params={"path": path, "user": "root"})
            assert r.status_code == 422 and "not a regular file" in r.json()["error"]["message"], (path, r.status_code, r.text)
            assert time.monotonic() - t < 20, f"{path} blocked the read"
            r = httpx.get(f"{base}/files", params={"path": path, "username": "root"}, headers=h, timeout=30)
            assert r.status_code == 400 and "not a regular file" in r.json()["message"], (path, r.status_code, r.text)
    with pytest.raises(BranchboxError):
        sbx.files.read("/dev/zero", user="root")
    # An empty regular file is still a 200 with nothing in it.
    root(sbx, ": > /tmp/empty")
    assert sbx.files.read("/tmp/empty", user="root") == ""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def upload_head(service, sbx: Sandbox, length: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", service.port), timeout=30)
    head = (f"POST /e2b/envd/files?path=/tmp/up HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            f"e2b-sandbox-id: {sbx.sandbox_id}\r\nx-api-key: {service.token}\r\n"
            f"content-type: multipart/form-data; boundary=B\r\ncontent-length: {length}\r\n\r\n")
    s.sendall(head.encode())
    return s


def answer(s: socket.socket) -> bytes:
    buf = b""
    s.settimeout(30)
    while b"\r\n\r\n" not in buf or not buf.rstrip().endswith(b"}"):
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return buf


def test_an_upload_with_a_huge_part_header_is_refused_and_branchboxd_stays_small(service, sbx):
    pid = service.proc.pid
    before = rss(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # The review's attack: one part whose header never ends, up to the whole-stream limit.
        size = 256 << 20
        s = upload_head(service, sbx, size + 64)
        s.sendall(b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nX-Pad: ")
        pad = b"a" * (1 << 20)
        for _ in range(size >> 20):
            if select.select([s], [], [], 0)[0]:
                break
            try:
                s.sendall(pad)
            except OSError:
                break
        got = answer(s)
        s.close()
    finally:
        done.set()
        sampler.join()
    grew = peak[0] - before
    assert grew < 64 << 20, f"branchboxd grew by {grew >> 20} MiB"
    assert b" 400 " in got.split(b"\r\n")[0] and str(MAX_PART_HEADERS).encode() in got, got[:500]


def test_uploads_into_one_sandbox_past_the_bound_are_refused_until_one_ends(service, sbx):
    held = []
    try:
        for _ in range(PER_SANDBOX):
            s = upload_head(service, sbx, 1 << 20)
            s.sendall(b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\npartial")
            held.append(s)
        time.sleep(1)
        base, h = envd(service, sbx)
        r = httpx.post(f"{base}/files", params={"path": "/tmp/one-more"}, headers=h, files={"file": ("f", b"x")})
        assert (r.status_code, r.json()["code"]) == (429, "resource_exhausted"), r.text
        assert "uploads are running" in r.json()["message"]
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 30
    while True:
        r = httpx.post(f"{base}/files", params={"path": "/tmp/one-more"}, headers=h, files={"file": ("f", b"x")})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text
