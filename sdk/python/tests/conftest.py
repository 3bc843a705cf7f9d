"""Fixtures: a real branchboxd over a fresh data directory, real gVisor sandboxes.

The binary is `$BRANCHBOXD`, or `target/debug/branchboxd` of this repository; the agent and
shim are taken from the same directory. Images come from `$BRANCHBOX_IMAGES` when set (the
cache `scripts/test.sh` shares), else they are built into the test data directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import httpx
import pytest

from branchbox import Sandbox

REPO = Path(__file__).resolve().parents[3]


def _binary() -> Path:
    p = Path(os.environ.get("BRANCHBOXD") or REPO / "target/debug/branchboxd")
    if not p.is_file():
        pytest.exit(f"{p} is missing: build it first (cargo build -p branchbox-service -p branchbox-agent -p branchbox-gvisor)")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def procs_under(path: Path) -> List[int]:
    """Pids of processes whose command line names `path` (shims, runsc), other than branchboxd."""
    out = []
    needle = str(path).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd and b"branchboxd" not in cmd:
            out.append(int(d.name))
    return out


class Service:
    """One branchboxd process, restartable on the same port and data directory."""

    def __init__(self, data_dir: Path, *args: str, env: Optional[dict] = None) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = dict(env or {})
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = data_dir.parent / f"{data_dir.name}-branchboxd.log"

    @property
    def token(self) -> str:
        return (self.data_dir / "service/token").read_text().strip()

    def headers(self) -> dict:
        return {"authorization": f"Bearer {self.token}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=600)

    def sdk(self) -> dict:
        """Connection arguments for the SDK."""
        return {"api_url": self.url, "token": self.token}

    def start(self) -> None:
        binary = _binary()
        env = dict(os.environ)
        env.setdefault("BRANCHBOX_AGENT", str(binary.parent / "branchbox-agent"))
        env.setdefault("BRANCHBOX_SHIM", str(binary.parent / "branchbox-shim"))
        env.setdefault("RUST_LOG", "warn")
        env.update(self.env)
        cmd = [str(binary), "--data-dir", str(self.data_dir), "--listen", f"127.0.0.1:{self.port}", *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        # At start the service first reconciles: after a crash mid-fork it reaps or adopts each
        # child (stopping runtimes and removing host cgroups), which takes seconds each on a
        # loaded 2-core host.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"branchboxd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("branchboxd did not answer /healthz within 120 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def kill_all(self) -> None:
        with self.client() as c:
            for s in c.get("/v1/sandboxes").json():
                c.delete(f"/v1/sandboxes/{s['id']}")


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    """Where the data directories go: `$BRANCHBOX_TEST_DIR` (whose owner cleans up whatever a
    crashed run leaves) or a temporary directory."""
    base = os.environ.get("BRANCHBOX_TEST_DIR")
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
        yield Path(base)
    else:
        d = Path(tempfile.mkdtemp(prefix="bbpy-"))
        yield d
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def _serve(workdir: Path, name: str, *args: str, env: Optional[dict] = None) -> Iterator[Service]:
    svc = Service(workdir / f"py-{os.getpid()}-{name}", *args, env=env)
    svc.start()
    try:
        yield svc
    finally:
        try:
            if svc.proc is None:
                svc.start()
            svc.kill_all()
        finally:
            svc.stop()
        leaked = procs_under(svc.data_dir)
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not leaked, f"processes left behind under {svc.data_dir}: {leaked}"
        shutil.rmtree(svc.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def service(workdir: Path) -> Iterator[Service]:
    """The main service (up to 80 sandboxes), with the image built before any test runs."""
    with _serve(workdir, "main", "--max-sandboxes", "80") as svc:
        os.environ["BRANCHBOX_URL"] = svc.url
        os.environ["BRANCHBOX_TOKEN"] = svc.token
        with svc.client() as c:
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            c.delete(f"/v1/sandboxes/{r.json()['id']}")
        yield svc


@pytest.fixture(scope="session")
def limited(workdir: Path, service: Service) -> Iterator[Service]:
    """A second service with tight limits: one sandbox, 1 MiB files."""
    with _serve(workdir, "limited", "--max-sandboxes", "1", "--max-file-mib", "1") as svc:
        yield svc


@pytest.fixture(scope="session")
def networked(workdir: Path, service: Service) -> Iterator[Service]:
    """A service whose sandboxes' uplinks end in a network namespace of the test run's own
    (`Service.netns`), never at the host's interfaces: what they serve is reached from there."""
    netns = f"bbpy-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        env = {"BRANCHBOX_NET_UPLINK_NETNS": netns, "BRANCHBOX_NET_STATE": str(workdir / f"{netns}-state")}
        with _serve(workdir, "networked", env=env) as svc:
            svc.netns = netns
            yield svc
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False)


@pytest.fixture
def sbx(service: Service) -> Iterator[Sandbox]:
    """A fresh sandbox, killed afterwards."""
    s = Sandbox.create(timeout=600, **service.sdk())
    yield s
    s.kill()
    s.close()


def wait_until(cond, what: str, limit: float = 60.0):
    """Polls `cond` until it returns something truthy; fails the test after `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    pytest.fail(f"{what} did not happen within {limit} s")
