"""The node actor: one per Ray node. It starts that node's branchboxd (its own data directory,
listening on the node's address), restarts it when it dies, sends the directory a heartbeat
with the node's address, capacity and sandboxes, and runs the `branchbox remote push/pull`
commands that move snapshots through S3 to and from its data directory (a pull asking the
source node's branchboxd for each chunk first).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx

from .directory import DIRECTORY_NAME, NAMESPACE

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it ends, so a node
    actor that dies (its raylet killed) takes its branchboxd with it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class Node:
    """The actor's class (wrapped with `ray.remote` by `Fleet.start`).

    `binary` is branchboxd; the `branchbox` command is taken beside it unless `cli` names it.
    `env` is added to both's environment (BRANCHBOX_IMAGES, BRANCHBOX_REMOTE,
    BRANCHBOX_S3_ENDPOINT, AWS_ACCESS_KEY_ID, ...)."""

    def __init__(self, name: str, data_dir: str, binary: str, max_sandboxes: int = 8,
                 env: Optional[Dict[str, str]] = None, cli: Optional[str] = None,
                 heartbeat_s: float = 0.5, directory: str = DIRECTORY_NAME, namespace: str = NAMESPACE,
                 extra_args: Optional[List[str]] = None) -> None:
        import ray

        self.name = name
        self.ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.binary = Path(binary)
        self.cli = Path(cli) if cli else self.binary.parent / "branchbox"
        self.max_sandboxes = int(max_sandboxes)
        self.env = dict(os.environ)
        self.env.setdefault("BRANCHBOX_AGENT", str(self.binary.parent / "branchbox-agent"))
        self.env.setdefault("BRANCHBOX_SHIM", str(self.binary.parent / "branchbox-shim"))
        self.env.setdefault("RUST_LOG", "warn")
        self.env.update(env or {})
        self.extra_args = list(extra_args or [])
        self.heartbeat_s = float(heartbeat_s)
        self.directory = directory
        self.namespace = namespace
        self.port = _free_port(self.ip)
        self.url = f"http://{self.ip}:{self.port}"
        self.log = self.data_dir.parent / f"{self.data_dir.name}-branchboxd.log"
        # The other alive nodes, for branchboxd's --peers: it forwards requests naming their
        # sandboxes to them, so any node's address serves the whole fleet (docs/fleet.md).
        self.peers_file = self.data_dir.parent / f"{self.data_dir.name}-peers.json"
        self._peers_text = ""
        self.restarts = -1
        self.snapshots: set = set()
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: Optional[str] = None
        # The supervisor starts branchboxd, so that it dies with this thread (and so the actor).
        threading.Thread(target=self._supervise, name="branchboxd-supervisor", daemon=True).start()
        if not self._ready.wait(180) or self._error:
            raise RuntimeError(f"node {name}: branchboxd did not start: {self._error or 'no answer in 180 s'}")
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()

    # --- branchboxd --------------------------------------------------------------------------

    def _start(self) -> None:
        cmd = [str(self.binary), "--data-dir", str(self.data_dir), "--listen", f"{self.ip}:{self.port}",
               "--max-sandboxes", str(self.max_sandboxes), "--peers", str(self.peers_file), *self.extra_args]
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                          preexec_fn=_die_with_parent)
        self.restarts += 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"branchboxd exited with {self._proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-1500:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("branchboxd did not answer /healthz within 120 s")

    def _supervise(self) -> None:
        try:
            self._start()
        except Exception as e:
            self._error = str(e)
            self._ready.set()
            return
        self._ready.set()
        while not self._stop.wait(0.2):
            with self._lock:
                if self._stop.is_set():
                    break
                if self._proc is not None and self._proc.poll() is not None:
                    try:
                        self._start()
                    except Exception as e:  # retried on the next round
                        self._error = str(e)
        with self._lock:
            self._terminate()

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    @property
    def token(self) -> str:
        return (self.data_dir / "service/token").read_text().strip()

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {self.token}"}, timeout=60)

    # --- heartbeats --------------------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """What the heartbeat sends: this node's address, capacity, sandboxes and snapshots."""
        taken_at = time.time()
        healthy = True
        sandboxes: List[Dict[str, str]] = []
        try:
            with self._client() as c:
                # This node's own: through a node with peers a listing is the whole fleet's.
                r = c.get("/v1/sandboxes", params={"local": "true"})
                r.raise_for_status()
                sandboxes = [{"id": s["id"], "state": s["state"]} for s in r.json()]
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            healthy = False
        return {"name": self.name, "node_id": self.node_id, "ip": self.ip, "url": self.url, "token": self.token,
                "max_sandboxes": self.max_sandboxes, "restarts": self.restarts,
                "pid": self._proc.pid if self._proc else None, "healthy": healthy, "taken_at": taken_at,
                "sandboxes": sandboxes, "snapshots": sorted(self.snapshots)}

    def _heartbeats(self) -> None:
        import ray

        directory = None
        while not self._stop.wait(self.heartbeat_s):
            try:
                if directory is None:
                    directory = ray.get_actor(self.directory, namespace=self.namespace)
                report = self.report()
                if report["healthy"]:  # an unhealthy node says nothing, and so is marked lost
                    ray.get(directory.heartbeat.remote(report), timeout=10)
                    self._write_peers(ray.get(directory.nodes.remote(), timeout=10))
            except Exception:
                directory = None  # looked up again: it may have restarted

    def _write_peers(self, nodes: List[Dict[str, Any]]) -> None:
        """Rewrites the peers file (mode 0600: it holds the peers' tokens) when the alive nodes
        other than this one changed; branchboxd re-reads it when it changes. It names this node
        too, which a fleet-wide listing through it gives as its sandboxes' `node`."""
        peers = [{"name": n["name"], "url": n["url"], "token": n["token"]} for n in nodes
                 if n.get("name") != self.name and n.get("state") == "alive" and n.get("url") and n.get("token")]
        text = json.dumps({"node": self.name, "peers": peers}, sort_keys=True)
        if text == self._peers_text:
            return
        tmp = self.peers_file.with_name(self.peers_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.peers_file)
        self._peers_text = text

    # --- calls -------------------------------------------------------------------------------

    def peer_names(self) -> List[str]:
        """The nodes the peers file (branchboxd's --peers) lists now."""
        return [p["name"] for p in json.loads(self._peers_text)["peers"]] if self._peers_text else []

    def info(self) -> Dict[str, Any]:
        r = self.report()
        r["data_dir"] = str(self.data_dir)
        return r

    def branchboxd_pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def _cli(self, *args: str, timeout: float = 600, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        cmd = [str(self.cli), "--data-dir", str(self.data_dir), *args, "--json"]
        p = subprocess.run(cmd, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"node {self.name}: `{' '.join(cmd[1:])}` failed ({p.returncode}): {p.stderr[-2000:]}")
        return json.loads(p.stdout)

    def push(self, snapshot: str) -> Dict[str, Any]:
        """`branchbox remote push SNAPSHOT` from this node's data directory."""
        out = self._cli("remote", "push", snapshot)
        self.snapshots.add(str(out["snapshot"]))
        return out

    def pull(self, snapshot_id: str, peer_url: Optional[str] = None, peer_token: Optional[str] = None) -> Dict[str, Any]:
        """`branchbox remote pull SNAPSHOT_ID` into this node's data directory; with `peer_url`,
        each chunk is asked of that node's branchboxd (its token in BRANCHBOX_PEER_TOKEN, never
        on the command line) before S3."""
        if peer_url:
            out = self._cli("remote", "pull", snapshot_id, "--peer", peer_url,
                            env={"BRANCHBOX_PEER_TOKEN": peer_token or ""})
        else:
            out = self._cli("remote", "pull", snapshot_id)
        self.snapshots.add(str(out["snapshot"]))
        return out

    def shutdown(self, kill_sandboxes: bool = True) -> None:
        """Destroys this node's sandboxes (unless told not to) and stops its branchboxd."""
        if kill_sandboxes:
            try:
                with self._client() as c:
                    for s in c.get("/v1/sandboxes", params={"local": "true"}).json():
                        c.delete(f"/v1/sandboxes/{s['id']}")
            except (httpx.HTTPError, OSError, ValueError):
                pass
        self._stop.set()
        with self._lock:
            self._terminate()
