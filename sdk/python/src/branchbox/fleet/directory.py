"""The fleet's directory: a detached, named Ray actor that knows which node runs which sandbox,
each node's capacity and address, and which node holds which pushed snapshot. It carries no
bytes. Everything in it comes from the node actors' heartbeats, so a restarted directory
rebuilds itself from the next round of them; a node whose heartbeats stop is marked lost, and
so is every sandbox it ran, with the reason.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

#: The directory actor's name and namespace.
DIRECTORY_NAME = "branchbox-directory"
NAMESPACE = "branchbox"


class Directory:
    """The actor's class (wrapped with `ray.remote` by `Fleet.start`)."""

    def __init__(self, lost_after_s: float = 3.0) -> None:
        self._lock = threading.Lock()
        self.lost_after_s = float(lost_after_s)
        #: When this incarnation started: a restart shows as a new value.
        self.started_at = time.time()
        self._nodes: Dict[str, Dict[str, Any]] = {}
        self._routes: Dict[str, Dict[str, Any]] = {}
        self._snapshots: Dict[str, Dict[str, Any]] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="directory-watch", daemon=True).start()

    # --- heartbeats --------------------------------------------------------------------------

    def heartbeat(self, report: Dict[str, Any]) -> Dict[str, Any]:
        """One node's state: its address, capacity, sandboxes and snapshots, as its node actor
        saw them at `report["taken_at"]`."""
        now = time.time()
        name = str(report["name"])
        taken_at = float(report["taken_at"])
        with self._lock:
            node = self._nodes.setdefault(name, {})
            if node.get("taken_at", 0.0) > taken_at:
                return {"started_at": self.started_at}  # an older report overtaken by a newer one
            node.update({k: report[k] for k in ("name", "node_id", "ip", "url", "token", "max_sandboxes",
                                                 "restarts", "pid", "healthy")})
            node.update(taken_at=taken_at, last_seen=now, state="alive", reason=None)
            seen = set()
            for sb in report["sandboxes"]:
                sid = str(sb["id"])
                seen.add(sid)
                self._routes[sid] = {"id": sid, "node": name, "state": str(sb["state"]), "reason": None,
                                     "seen_at": taken_at}
            for sid, route in list(self._routes.items()):
                # Gone from its node: killed, or timed out there. A route added after the report
                # was taken stays until a later report.
                if route["node"] == name and sid not in seen and route["seen_at"] < taken_at:
                    del self._routes[sid]
            node["running"] = sum(1 for r in self._routes.values() if r["node"] == name and r["state"] == "running")
            node["sandboxes"] = sum(1 for r in self._routes.values() if r["node"] == name)
            for snap in report.get("snapshots", []):
                self._snapshots.setdefault(str(snap), {"id": str(snap), "nodes": set()})["nodes"].add(name)
        return {"started_at": self.started_at}

    def add_route(self, sandbox_id: str, node: str, state: str = "running") -> None:
        """Records a sandbox the fleet just placed, before its node's next heartbeat names it."""
        with self._lock:
            self._routes[sandbox_id] = {"id": sandbox_id, "node": node, "state": state, "reason": None,
                                        "seen_at": time.time()}

    def add_snapshot(self, snapshot_id: str, node: str) -> None:
        """Records that `node` holds pushed snapshot `snapshot_id` (after a push or a pull)."""
        with self._lock:
            self._snapshots.setdefault(snapshot_id, {"id": snapshot_id, "nodes": set()})["nodes"].add(node)

    # --- liveness ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            now = time.time()
            with self._lock:
                late = [(n, now - n["last_seen"]) for n in self._nodes.values()
                        if n["state"] == "alive" and now - n["last_seen"] > self.lost_after_s]
            for node, silent in late:
                self._lose(node["name"], f"node {node['name']} ({node['ip']}) lost: no heartbeat for {silent:.1f} s"
                                         f"{self._ray_says(node.get('node_id'))}")

    @staticmethod
    def _ray_says(node_id: Optional[str]) -> str:
        try:
            import ray

            for n in ray.nodes():
                if n.get("NodeID") == node_id:
                    return "; Ray reports its raylet " + ("alive" if n.get("Alive") else "dead")
        except Exception as e:  # the reason is still given without Ray's view
            return f"; Ray's node table unreadable ({type(e).__name__})"
        return "; Ray does not know the node"

    def _lose(self, name: str, reason: str) -> None:
        with self._lock:
            node = self._nodes.get(name)
            if node is None or node["state"] != "alive":
                return
            node.update(state="lost", reason=reason, running=0)
            for route in self._routes.values():
                if route["node"] == name and route["state"] != "lost":
                    route.update(state="lost", reason=reason)
            for snap in self._snapshots.values():
                snap["nodes"].discard(name)

    def mark_lost(self, name: str, reason: str) -> None:
        """Marks a node lost at once (its actor is known dead) with `reason`."""
        self._lose(name, reason)

    # --- queries -----------------------------------------------------------------------------

    def nodes(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [dict(n) for n in sorted(self._nodes.values(), key=lambda n: n["name"])]

    def sandboxes(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [{k: r[k] for k in ("id", "node", "state", "reason")}
                    for r in sorted(self._routes.values(), key=lambda r: r["id"])]

    def route(self, sandbox_id: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            r = self._routes.get(sandbox_id)
            if r is None:
                return None
            node = self._nodes.get(r["node"], {})
            return {"id": sandbox_id, "node": r["node"], "state": r["state"], "reason": r["reason"],
                    "url": node.get("url"), "token": node.get("token")}

    def snapshots(self) -> Dict[str, List[str]]:
        """Pushed snapshots and the nodes that hold them (alive ones only)."""
        with self._lock:
            return {k: sorted(v["nodes"]) for k, v in self._snapshots.items()}

    def started(self) -> float:
        return self.started_at
