"""The fleet tests' cluster: a Ray head and three workers on 127.0.0.2-127.0.0.5, one
branchboxd per node (each with its own data directory), and, when the `weed` command is
installed, a SeaweedFS S3 server on 127.0.0.2. Every process is ended by PID at the end,
and what is left under a node's data directory fails the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional

import httpx

from branchbox.fleet import LocalCluster
from branchbox.fleet.cluster import processes_naming

NODES = ("n2", "n3", "n4", "n5")
KEY, SECRET = "bbfleet", "bbfleet-secret-key"


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class Weed:
    """`weed mini`'s S3 on 127.0.0.2 over a data directory of its own."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0

    @staticmethod
    def binary() -> Optional[str]:
        local = Path(sys.executable).parent / "weed"
        return str(local) if local.is_file() else shutil.which("weed")

    def start(self) -> Dict[str, str]:
        binary = self.binary()
        assert binary is not None
        self.base.mkdir(parents=True, exist_ok=True)
        ports = {k: _free_port("127.0.0.2") for k in ("master", "volume", "filer", "s3", "admin")}
        self.port = ports["s3"]
        # One identity, so that S3 asks for SigV4 signatures as a real deployment does.
        cfg = self.base.parent / "weed-s3.json"
        cfg.write_text(json.dumps({"identities": [{"name": "fleet", "credentials": [
            {"accessKey": KEY, "secretKey": SECRET}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        (self.base / "data").mkdir(exist_ok=True)
        cmd = [binary, "mini", f"-dir={self.base / 'data'}", "-ip=127.0.0.2", "-ip.bind=127.0.0.2",
               "-bucket=bbfleet", f"-s3.config={cfg}", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
               "-s3.port.lance=0"]
        for k, port in ports.items():
            # The grpc ports too: their default (port + 10000) may be taken or out of range.
            cmd += [f"-{k}.port={port}", f"-{k}.port.grpc={_free_port('127.0.0.2')}"]
        with open(self.base.parent / "weed.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}")
            try:
                httpx.get(f"http://127.0.0.2:{self.port}/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        return {"BRANCHBOX_REMOTE": "s3://bbfleet/snapshots", "BRANCHBOX_S3_ENDPOINT": f"http://127.0.0.2:{self.port}",
                "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_REGION": "us-east-1"}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for pid in processes_naming(self.base):
            os.kill(pid, signal.SIGKILL)


def _clean_node_dir(data_dir: Path) -> None:
    """Ends what a node left behind: when sandboxes still run there (a lost node's), a
    short-lived branchboxd over its data directory destroys them; then anything still naming
    it is killed by PID and reported."""
    from conftest import Service, procs_under

    if procs_under(data_dir) and (data_dir / "service/token").exists():
        svc = Service(data_dir)
        try:
            svc.start()
            svc.kill_all()
        finally:
            svc.stop()
    left = procs_under(data_dir)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind under {data_dir}: {left}"


@contextmanager
def fleet_cluster(workdir: Path) -> Iterator[dict]:
    import ray

    from branchbox.fleet import Fleet, cross_node_missing

    base = workdir / f"fleet-{os.getpid()}"
    # Ray's sockets live below its temp dirs and a Unix socket path holds 107 bytes, so Ray's
    # directories go under /tmp whatever the workdir's length (LocalCluster refuses longer).
    ray_base = Path(tempfile.mkdtemp(prefix="bbray-"))
    cluster = LocalCluster(ray_base)
    # S3 only serves the cross-node tests, which need `branchbox remote push/pull`.
    weed = Weed(base / "weed") if Weed.binary() and cross_node_missing() is None else None
    fleet = None
    try:
        cluster.start()
        s3 = weed.start() if weed else {}
        env = {k: os.environ[k] for k in ("BRANCHBOX_IMAGES", "RUST_LOG") if k in os.environ}
        env.update(s3)
        t0 = time.monotonic()
        ray.init(address=cluster.address, _node_ip_address=cluster.ips[0], namespace="branchbox",
                 log_to_driver=False, logging_level="warning")
        fleet = Fleet.start(base / "data", max_sandboxes=6, env=env, directory_node="n2")
        yield {"cluster": cluster, "fleet": fleet, "s3": s3, "base": base,
               "fleet_start_s": time.monotonic() - t0}
    finally:
        try:
            if fleet is not None:
                fleet.shutdown()
        except Exception as e:  # the rest of the cleanup goes on
            print(f"fleet shutdown: {e}")
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
        assert not cluster.pids(), f"Ray processes left: {cluster.pids()}"
        if weed:
            weed.stop()
        for n in NODES:
            d = base / "data" / n
            if d.exists():
                _clean_node_dir(d)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(ray_base, ignore_errors=True)
