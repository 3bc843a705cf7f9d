"""`Fleet`: the client side of branchbox on Ray. It starts the node actors and the directory,
places sandboxes, hands out `branchbox.Sandbox` objects bound to the owning node's branchboxd,
and forks across nodes (the source's node first, then one share per other node, each fed by
one push of the source snapshot to S3 and one pull on that node, from the source node's
branchboxd first and S3 second)."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import httpx

from ..exceptions import BranchboxError
from ..sandbox import Sandbox
from .cluster import NODE_LABEL
from .directory import DIRECTORY_NAME, NAMESPACE, Directory
from .node import Node


def _holds(node: "NodeInfo", sandbox_id: str) -> bool:
    """Whether `node`'s branchboxd itself holds the sandbox: a request marked as forwarded is
    answered by the node it reaches, never passed on to a peer."""
    r = httpx.get(f"{node.url}/v1/sandboxes/{sandbox_id}", timeout=30,
                  headers={"authorization": f"Bearer {node.token}", "x-branchbox-forwarded": "fleet"})
    return r.status_code == 200


class LostSandboxError(BranchboxError):
    """The sandbox's node is lost: the sandbox cannot be reached (the message says why)."""


@dataclass
class NodeInfo:
    name: str
    ip: str
    url: str
    token: str
    state: str
    reason: Optional[str]
    sandboxes: int
    running: int
    max_sandboxes: int
    restarts: int

    @property
    def free(self) -> int:
        return max(0, self.max_sandboxes - self.sandboxes)

    @classmethod
    def parse(cls, d: Dict[str, Any]) -> "NodeInfo":
        return cls(d["name"], d["ip"], d["url"], d["token"], d["state"], d.get("reason"), d.get("sandboxes", 0),
                   d.get("running", 0), d["max_sandboxes"], d.get("restarts", 0))


@dataclass
class SandboxRoute:
    id: str
    node: str
    state: str
    reason: Optional[str]


@dataclass
class ForkResult:
    """The children of a fleet fork, each with its node, and how the snapshot travelled."""

    children: List[Tuple[str, Sandbox]] = field(default_factory=list)
    #: `branchbox remote push` and `pull` answers (empty when every child stayed local).
    push: Optional[Dict[str, Any]] = None
    pulls: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def placement(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for node, _ in self.children:
            out[node] = out.get(node, 0) + 1
        return out


def _default_binary() -> Path:
    env = os.environ.get("BRANCHBOXD")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[5] / "target/debug/branchboxd"


def cross_node_missing(cli: Optional[Union[str, Path]] = None) -> Optional[str]:
    """None when `branchbox remote push/pull` (which moves snapshots between nodes through S3)
    is there; else what is missing, in one line."""
    path = Path(cli) if cli else _default_binary().parent / "branchbox"
    if not path.is_file():
        return f"{path} is missing"
    p = subprocess.run([str(path), "remote", "--help"], capture_output=True, text=True)
    if p.returncode != 0 or "push" not in p.stdout or "pull" not in p.stdout:
        return f"`{path.name} remote push/pull` is not built yet (no `remote` command in {path})"
    return None


def _node_actor_name(name: str) -> str:
    return f"branchbox-node-{name}"


class Fleet:
    """A handle on a running fleet; `Fleet()` inside any Ray driver, task or actor of the cluster
    finds it by name. `Fleet.start(...)` starts one."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        import ray

        self.namespace = namespace
        self.directory = ray.get_actor(DIRECTORY_NAME, namespace=namespace)

    # --- start and stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, data_root: Union[str, Path], binary: Optional[Union[str, Path]] = None, max_sandboxes: int = 8,
              env: Optional[Dict[str, str]] = None, nodes: Optional[Sequence[str]] = None,
              namespace: str = NAMESPACE, lost_after_s: float = 3.0, heartbeat_s: float = 0.5,
              directory_node: Optional[str] = None, timeout: float = 300) -> "Fleet":
        """Starts the directory (unless it runs) and a node actor, with its branchboxd under
        `data_root/NAME`, on each Ray node labelled `branchbox.io/node` (or those named)."""
        import ray

        labelled = sorted(n["Labels"][NODE_LABEL] for n in ray.nodes()
                          if n["Alive"] and NODE_LABEL in (n.get("Labels") or {}))
        names = list(nodes) if nodes is not None else labelled
        missing = [n for n in names if n not in labelled]
        if missing:
            raise ValueError(f"no alive Ray node labelled {NODE_LABEL}={missing[0]}")
        opts: Dict[str, Any] = dict(name=DIRECTORY_NAME, namespace=namespace, lifetime="detached", max_restarts=-1,
                                    num_cpus=0, get_if_exists=True)
        if directory_node:
            opts["label_selector"] = {NODE_LABEL: directory_node}
        ray.remote(Directory).options(**opts).remote(lost_after_s)
        binary = Path(binary) if binary else _default_binary()
        actor = ray.remote(Node)
        actors = [actor.options(name=_node_actor_name(n), namespace=namespace, lifetime="detached", num_cpus=0,
                                max_concurrency=8, max_restarts=0, label_selector={NODE_LABEL: n})
                  .remote(n, str(Path(data_root) / n), str(binary), max_sandboxes, env, None, heartbeat_s)
                  for n in names]
        ray.get([a.info.remote() for a in actors], timeout=timeout)
        fleet = cls(namespace)
        deadline = time.monotonic() + timeout
        # Ready when every node is alive in the directory and every branchboxd's peers file
        # names all the others (so any node forwards to any other from the start).
        while True:
            if {n.name for n in fleet.nodes() if n.state == "alive"} >= set(names):
                peers = ray.get([a.peer_names.remote() for a in actors], timeout=timeout)
                if all(set(p) >= set(names) - {n} for n, p in zip(names, peers)):
                    return fleet
            if time.monotonic() > deadline:
                raise TimeoutError("the node actors' heartbeats did not reach the directory, or their peers files "
                                   "do not list every node yet")
            time.sleep(0.1)

    def node_actor(self, name: str) -> Any:
        import ray

        return ray.get_actor(_node_actor_name(name), namespace=self.namespace)

    def shutdown(self) -> None:
        """Destroys every sandbox of every reachable node, stops the branchboxds and ends the
        node actors and the directory."""
        import ray

        actors, refs = [], []
        for n in self.nodes():
            if n.state != "alive":
                continue  # its actor went with its node
            try:
                a = self.node_actor(n.name)
            except ValueError:
                continue
            actors.append(a)
            refs.append(a.shutdown.remote())
        # All nodes at once; a node that fails to answer is ended all the same.
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=120)
        for a in actors:
            ray.kill(a)
        ray.kill(self.directory, no_restart=True)

    # --- what runs where ---------------------------------------------------------------------

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=60)

    def nodes(self) -> List[NodeInfo]:
        return [NodeInfo.parse(d) for d in self._get(self.directory.nodes.remote())]

    def node(self, name: str) -> NodeInfo:
        for n in self.nodes():
            if n.name == name:
                return n
        raise KeyError(f"no node {name} in the fleet")

    def sandboxes(self) -> List[SandboxRoute]:
        """Every sandbox the fleet knows, with its node and state: "running", "paused", or
        "lost" with the reason (its node stopped answering)."""
        return [SandboxRoute(**d) for d in self._get(self.directory.sandboxes.remote())]

    def least_loaded(self, exclude: Sequence[str] = ()) -> NodeInfo:
        alive = [n for n in self.nodes() if n.state == "alive" and n.name not in exclude and n.free > 0]
        if not alive:
            raise BranchboxError("no node of the fleet has room for a sandbox")
        return min(alive, key=lambda n: (n.sandboxes / max(1, n.max_sandboxes), n.name))

    def _alive(self, name: str) -> NodeInfo:
        node = self.node(name)
        if node.state != "alive":
            raise LostSandboxError(node.reason or f"node {name} is lost")
        return node

    # --- sandboxes ---------------------------------------------------------------------------

    def create(self, node: Optional[str] = None, **kwargs: Any) -> Sandbox:
        """A new sandbox on `node` (else the least loaded one); the arguments are
        `Sandbox.create`'s. The result talks to its node's branchboxd directly."""
        info = self._alive(node) if node else self.least_loaded()
        sbx = Sandbox.create(api_url=info.url, token=info.token, **kwargs)
        # A node at its cap passes a create on to a peer (docs/fleet.md); the fleet places
        # sandboxes itself, so one that landed elsewhere is given back and the node's being
        # full is raised, as a create on a full node did before.
        if not _holds(info, sbx.sandbox_id):
            sbx.kill()
            raise BranchboxError(f"node {info.name} runs its most sandboxes ({info.max_sandboxes}); "
                                 "kill some there, or create without node= for the least loaded one")
        self._get(self.directory.add_route.remote(sbx.sandbox_id, info.name))
        return sbx

    def node_of(self, sandbox: Union[str, Sandbox]) -> str:
        sid = sandbox if isinstance(sandbox, str) else sandbox.sandbox_id
        route = self._get(self.directory.route.remote(sid))
        if route is None:
            raise BranchboxError(f"the fleet knows no sandbox {sid}")
        return route["node"]

    def sandbox(self, sandbox_id: str) -> Sandbox:
        """A handle on a sandbox of the fleet, bound to the branchboxd of the node it runs on,
        from wherever this is called. Raises `LostSandboxError` (with the reason) when its node
        is lost."""
        route = self._get(self.directory.route.remote(sandbox_id))
        if route is None:
            raise BranchboxError(f"the fleet knows no sandbox {sandbox_id}")
        if route["state"] == "lost":
            raise LostSandboxError(route["reason"])
        return Sandbox._by_id(sandbox_id, route["url"], route["token"], None)

    # --- snapshots across nodes --------------------------------------------------------------

    def push(self, node: str, snapshot: str) -> Dict[str, Any]:
        """Pushes `snapshot` from `node`'s data directory to S3; answers `branchbox remote push`'s JSON."""
        out = self._get_long(self.node_actor(node).push.remote(snapshot))
        self._get(self.directory.add_snapshot.remote(str(out["snapshot"]), node))
        return out

    def pull(self, node: str, snapshot_id: str, peer: Optional[str] = None) -> Dict[str, Any]:
        """Pulls pushed snapshot `snapshot_id` into `node`'s data directory. With `peer` (a node
        that holds it), each chunk is fetched from that node's branchboxd first and from S3
        when the peer fails; the answer counts `peer_bytes` and `s3_bytes`."""
        if peer is not None and peer != node:
            p = self.node(peer)
            ref = self.node_actor(node).pull.remote(snapshot_id, p.url, p.token)
        else:
            ref = self.node_actor(node).pull.remote(snapshot_id)
        out = self._get_long(ref)
        self._get(self.directory.add_snapshot.remote(str(out["snapshot"]), node))
        return out

    def holders(self, snapshot_id: str) -> List[str]:
        """The alive nodes that hold pushed snapshot `snapshot_id`."""
        return self._get(self.directory.snapshots.remote()).get(snapshot_id, [])

    def spread(self, snapshot: str, source: str, nodes: Sequence[str]) -> Dict[str, str]:
        """Makes `snapshot` of node `source` available on `nodes`: one push, one pull on each
        (side by side, from `source` first, S3 second). Returns each node's id for it, `source`
        included (for `run_episodes`)."""
        pushed = str(self.push(source, snapshot)["snapshot"])
        out = {source: snapshot}
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            for node, got in zip(nodes, pool.map(lambda n: self.pull(n, pushed, peer=source), nodes)):
                out[node] = str(got["snapshot"])
        return out

    @staticmethod
    def _get_long(ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=900)

    # --- fork --------------------------------------------------------------------------------

    def fork(self, sandbox: Union[str, Sandbox], count: int, local: Optional[int] = None,
             nodes: Optional[Sequence[str]] = None) -> ForkResult:
        """Forks `count` children of `sandbox`. Its own node takes as many as it has room for
        (or `local`), by today's local fork; the rest are shared out over the other alive nodes
        (or `nodes`), those that hold the source's parent snapshot (so most of its chunks)
        first, then those with the most room, one share per node: one push
        of a snapshot of the source to S3, one pull on each of those nodes (each chunk from the
        source node's branchboxd first, S3 second), then local forks there. Raises when a child
        cannot be placed."""
        t0 = time.monotonic()
        sid = sandbox if isinstance(sandbox, str) else sandbox.sandbox_id
        src_name = self.node_of(sid)
        src = self._alive(src_name)
        source = self.sandbox(sid)
        here = min(count, src.free) if local is None else min(count, local)
        result = ForkResult()
        if here > 0:
            result.children += [(src_name, self._child(c, src_name)) for c in source.fork(here)]
        rest = count - here
        if rest <= 0:
            result.seconds = time.monotonic() - t0
            return result
        # Nodes that hold the source's parent snapshot already hold most of the chunks.
        parent = source.get_info().parent_snapshot
        shares = self._shares(rest, src_name, nodes, set(self.holders(parent)) if parent else set())
        missing = cross_node_missing()
        if missing:
            raise BranchboxError(f"cannot fork across nodes: {missing}")
        snap = source.create_snapshot()
        result.push = self.push(src_name, snap.snapshot_id)
        remote_id = str(result.push["snapshot"])

        def place(node: str, share: int) -> List[Tuple[str, Sandbox]]:
            result.pulls[node] = self.pull(node, remote_id, peer=src_name)
            first = self.create(node=node, snapshot_id=str(result.pulls[node]["snapshot"]))
            kids = [(node, first)]
            if share > 1:
                kids += [(node, self._child(c, node)) for c in first.fork(share - 1)]
            return kids

        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            for kids in pool.map(lambda s: place(*s), shares):
                result.children += kids
        result.seconds = time.monotonic() - t0
        return result

    def _child(self, child: Union[Sandbox, BaseException], node: str) -> Sandbox:
        if isinstance(child, BaseException):
            raise child
        self._get(self.directory.add_route.remote(child.sandbox_id, node))
        return child

    def _shares(self, rest: int, source: str, nodes: Optional[Sequence[str]], held: set) -> List[Tuple[str, int]]:
        alive = {n.name: n for n in self.nodes() if n.state == "alive" and n.name != source}
        names = [n for n in nodes if n in alive] if nodes is not None else list(alive)
        names.sort(key=lambda n: (n not in held, -alive[n].free, n))
        names = [n for n in names if alive[n].free > 0]
        if not names:
            raise BranchboxError(f"no other node has room for {rest} more children")
        per = -(-rest // len(names))  # an even share each, as few nodes as that needs
        out: List[Tuple[str, int]] = []
        for n in names:
            take = min(per, rest, alive[n].free)
            if take > 0:
                out.append((n, take))
                rest -= take
        if rest > 0:
            raise BranchboxError(f"the fleet has no room for {rest} of the children")
        return out
