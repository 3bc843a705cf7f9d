"""A Ray cluster of several nodes on one machine, for tests and trials: a head and workers on
loopback addresses of their own (127.0.0.2, 127.0.0.3, ...), each with its own temporary
directory and a `branchbox.io/node` label. Every process it starts is found again, and ended,
by PID: never with `ray stop`, which ends every Ray process on the machine.

127.0.0.1 is refused as a node address: Ray rewrites it to the machine's own address.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

#: The label each node carries; its value is the node's name in the fleet ("n3" for 127.0.0.3).
NODE_LABEL = "branchbox.io/node"


def node_name(ip: str) -> str:
    """The fleet's name of the node at `ip`: "n" and the address's last number."""
    return "n" + ip.rsplit(".", 1)[-1]


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parents() -> Dict[int, int]:
    """Every process's parent, from /proc."""
    out: Dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after the last ')'.
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) > 1:
            out[int(d.name)] = int(rest[1])
    return out


def processes_naming(path: Path) -> List[int]:
    """PIDs of the processes whose command line names `path`, and their descendants."""
    needle = str(path).encode()
    parents = _parents()
    found = {pid for pid in parents if needle in _cmdline(pid)}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    # Never this process or one it runs under (their command lines may name the path too).
    pid = os.getpid()
    while pid > 1:
        found.discard(pid)
        pid = parents.get(pid, 1)
    return sorted(found)


def _kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class RayNode:
    """One node of a `LocalCluster`."""

    name: str
    ip: str
    temp_dir: Path
    head: bool
    started_s: float = 0.0

    def pids(self) -> List[int]:
        """Its processes (raylet, GCS on the head, agents, workers), by its temporary directory."""
        return processes_naming(self.temp_dir)

    def raylet_pid(self) -> Optional[int]:
        """The PID of its raylet, or None once it is gone."""
        needle = str(self.temp_dir).encode()
        for pid in self.pids():
            cmd = _cmdline(pid)
            if cmd.split(b"\0", 1)[0].endswith(b"/raylet") and needle in cmd:
                return pid
        return None


# The longest Unix socket path Ray accepts, and the most its session directory and socket
# name add below a node's temp dir.
MAX_SOCKET_PATH = 107
RAY_SOCKET_TAIL = len("/session_2026-12-03_21-12-44_521816_4194304/sockets/plasma_store")


@dataclass
class LocalCluster:
    """A head on `ips[0]` and one worker on each further address, all on this machine.

    `start()` returns once every node has joined; `kill_raylet(name)` ends one node the way a
    crash would; `stop()` ends every process the cluster started, by PID."""

    base: Path
    ips: Sequence[str] = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    num_cpus: int = 1
    object_store_bytes: int = 80 * 1024 * 1024
    ray: str = field(default_factory=lambda: str(Path(sys.executable).parent / "ray"))
    nodes: List[RayNode] = field(default_factory=list)
    port: int = 0
    start_s: float = 0.0

    def __post_init__(self) -> None:
        # Ray puts its sockets at <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store
        # (up to 64 bytes below the temp dir, <base>/nX) and refuses a path past AF_UNIX's 107.
        room = MAX_SOCKET_PATH - RAY_SOCKET_TAIL - len("/n2")
        if len(str(Path(self.base).absolute())) > room:
            raise ValueError(f"{self.base}: Ray's socket paths below it would pass the {MAX_SOCKET_PATH}-byte "
                             f"limit of Unix socket paths; use a base directory of at most {room} "
                             "characters (one under /tmp, say)")
        for ip in self.ips:
            if ip.startswith("127.0.0.1") or ip in ("localhost", "0.0.0.0"):
                raise ValueError(f"{ip}: Ray rewrites this address to the machine's own; use 127.0.0.2 and up")

    @property
    def address(self) -> str:
        return f"{self.ips[0]}:{self.port}"

    def _env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def _start_node(self, ip: str, head: bool) -> subprocess.Popen:
        node = RayNode(node_name(ip), ip, self.base / node_name(ip), head)
        node.temp_dir.mkdir(parents=True, exist_ok=True)
        self.nodes.append(node)
        cmd = [self.ray, "start", f"--node-ip-address={ip}", f"--num-cpus={self.num_cpus}",
               f"--object-store-memory={self.object_store_bytes}", "--disable-usage-stats",
               f"--temp-dir={node.temp_dir}", f"--labels={NODE_LABEL}={node.name}"]
        if head:
            cmd += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            cmd += [f"--address={self.address}"]
        log = open(self.base / f"{node.name}-start.log", "wb")
        return subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 120.0) -> "LocalCluster":
        """Starts the head, then the workers side by side; raises when one does not come up."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.port = _free_port(self.ips[0])
        t0 = time.monotonic()
        starters = [self._start_node(self.ips[0], True)]
        self._wait(starters, timeout)
        starters = [self._start_node(ip, False) for ip in self.ips[1:]]
        self._wait(starters, timeout)
        self.start_s = time.monotonic() - t0
        return self

    def _wait(self, starters: List[subprocess.Popen], timeout: float) -> None:
        for p in starters:
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise RuntimeError(f"`ray start` did not finish within {timeout} s (logs in {self.base})")
            if rc != 0:
                raise RuntimeError(f"`ray start` failed with {rc}: {self.log_tail()}")

    def log_tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(self.base.glob("*-start.log")))

    def node(self, name: str) -> RayNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def kill_raylet(self, name: str) -> int:
        """Ends node `name` as a crash would: SIGKILL to its raylet's PID. Returns that PID."""
        pid = self.node(name).raylet_pid()
        if pid is None:
            raise RuntimeError(f"node {name} has no raylet running")
        os.kill(pid, signal.SIGKILL)
        return pid

    def pids(self) -> List[int]:
        out: List[int] = []
        for n in self.nodes:
            out += n.pids()
        return sorted(set(out))

    def stop(self) -> List[int]:
        """Ends every process of every node by PID (workers first, the head last) and returns
        the PIDs it had to end."""
        ended: List[int] = []
        for n in sorted(self.nodes, key=lambda n: n.head):
            pids = n.pids()
            _kill(pids)
            ended += pids
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.pids():
            _kill(self.pids())
            time.sleep(0.1)
        return ended
