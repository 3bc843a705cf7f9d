"""What the service returns, as typed objects."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Dict, List, Optional


def _time(ms: Optional[int]) -> Optional[datetime]:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the service sees it."""

    sandbox_id: str
    state: str
    backend: str
    image: str
    started_at: datetime
    parent_snapshot: Optional[str]
    metadata: Dict[str, str]
    end_at: Optional[datetime]
    on_timeout: str
    limits: Dict[str, int]
    created_by: Optional[str]
    #: Why its runtime ended, when `state` is "lost" (e.g. "memory_limit: ...").
    lost_reason: Optional[str] = None
    #: The host limit its answers broke, when they did (a sign of forged agent frames).
    flagged: Optional[str] = None
    #: E2B's fields: the template it was made from when this client made it (else its image),
    #: and that template's name.
    template_id: str = ""
    name: str = ""
    #: The fleet node that holds it: given in a listing through a node with peers (docs/fleet.md),
    #: None otherwise.
    node: Optional[str] = None

    @staticmethod
    def parse(d: Dict[str, Any]) -> "SandboxInfo":
        template = d.get("template") or d["image"]
        return SandboxInfo(
            template_id=template,
            name=template,
            sandbox_id=d["id"],
            state=d["state"],
            backend=d["backend"],
            image=d["image"],
            started_at=_time(d["created_ms"]) or datetime.now(timezone.utc),
            parent_snapshot=d.get("parent_snapshot"),
            metadata=dict(d.get("metadata") or {}),
            end_at=_time(d.get("expires_ms")),
            on_timeout=d.get("on_timeout", "kill"),
            limits=dict(d.get("limits") or {}),
            created_by=d.get("created_by"),
            lost_reason=d.get("lost_reason"),
            flagged=d.get("flagged"),
            node=d.get("node"),
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """An immutable snapshot (or checkpoint, or fork point)."""

    snapshot_id: str
    kind: str
    name: Optional[str]
    parent: Optional[str]
    source: Optional[str]
    created_at: datetime
    size_bytes: int
    deleted: bool

    @staticmethod
    def parse(d: Dict[str, Any]) -> "SnapshotInfo":
        return SnapshotInfo(
            snapshot_id=d["id"],
            kind=d["kind"],
            name=d.get("name"),
            parent=d.get("parent"),
            source=d.get("source"),
            created_at=_time(d["created_ms"]) or datetime.now(timezone.utc),
            size_bytes=int(d.get("size_bytes", 0)),
            deleted=bool(d.get("deleted", False)),
        )


@dataclass(frozen=True)
class GcReport:
    """What gc found, and freed unless it was a report only (``dry_run``)."""

    dry_run: bool
    freed_bytes: int
    expired_snapshots: List[str]
    kept_with_descendants: List[str]
    unreachable_fork_points: List[str]
    orphan_snapshot_dirs: List[str]
    lost_sandboxes: List[str]
    orphan_sandbox_dirs: List[str]
    unused_images: List[str]
    unused_disks: List[str]
    #: Sandbox networks on the host whose sandbox directory is gone.
    orphan_networks: List[str]
    adopted: List[str]
    reaped: List[str]

    @staticmethod
    def parse(d: Dict[str, Any]) -> "GcReport":
        lists = {k: [str(x) for x in d.get(k) or []] for k in (
            "expired_snapshots", "kept_with_descendants", "unreachable_fork_points", "orphan_snapshot_dirs",
            "lost_sandboxes", "orphan_sandbox_dirs", "unused_images", "unused_disks", "orphan_networks",
            "adopted", "reaped")}
        return GcReport(dry_run=bool(d["dry_run"]), freed_bytes=int(d.get("freed_bytes", 0)), **lists)


@dataclass(frozen=True)
class CommandResult:
    """How a command ended, with its output."""

    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False
    duration_ms: int = 0
    #: A process of the command was killed at the sandbox's memory limit.
    oom_killed: bool = False
    #: The checkpoint taken after the command when the sandbox is in step-history mode.
    checkpoint: Optional[str] = None

    @property
    def error(self) -> str:
        """Standard error."""
        return self.stderr

    @staticmethod
    def parse(d: Dict[str, Any], stdout: Optional[str] = None, stderr: Optional[str] = None) -> "CommandResult":
        return CommandResult(
            stdout=d.get("stdout", "") if stdout is None else stdout,
            stderr=d.get("stderr", "") if stderr is None else stderr,
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out", False)),
            truncated=bool(d.get("truncated", False)),
            duration_ms=int(d.get("duration_ms", 0)),
            oom_killed=bool(d.get("oom_killed", False)),
            checkpoint=d.get("checkpoint"),
        )


@dataclass(frozen=True)
class ProcessInfo:
    """A background process."""

    pid: int
    argv: List[str]
    running: bool
    exit_code: Optional[int]
    signal: Optional[int]

    @staticmethod
    def parse(d: Dict[str, Any]) -> "ProcessInfo":
        return ProcessInfo(d["pid"], list(d["argv"]), bool(d["running"]), d.get("exit_code"), d.get("signal"))


@dataclass(frozen=True)
class EntryInfo:
    """A file or directory in a sandbox."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    modified_time: datetime

    @staticmethod
    def parse(d: Dict[str, Any]) -> "EntryInfo":
        return EntryInfo(
            name=d["name"],
            path=d["path"],
            type=d["kind"],
            size=int(d["size"]),
            mode=int(d["mode"]),
            modified_time=datetime.fromtimestamp(d["mtime_ns"] / 1e9, tz=timezone.utc),
        )


@dataclass(frozen=True)
class WriteInfo:
    """A file written: its path and size, and E2B's `name` and `type` ("file")."""

    path: str
    size: int
    name: str = ""
    type: str = "file"

    @staticmethod
    def parse(d: Dict[str, Any]) -> "WriteInfo":
        path = d["path"]
        return WriteInfo(path, int(d["size"]), name=path.rstrip("/").rsplit("/", 1)[-1], type="file")


@dataclass(frozen=True)
class SandboxMetrics:
    """Resource use measured in the sandbox (E2B's fields; bytes, and percent of the CPUs); a
    figure the sandbox's kernel does not give is None."""

    timestamp: datetime
    cpu_count: Optional[int]
    cpu_used_pct: Optional[float]
    mem_total: Optional[int]
    mem_used: Optional[int]
    disk_total: Optional[int]
    disk_used: Optional[int]


@dataclass(frozen=True)
class NetworkInfo:
    """A networked sandbox's egress policy and counters (docs/network.md)."""

    #: "internet" (public addresses; private ranges refused), "deny_all" or "allow_list".
    mode: str
    #: With "allow_list": the IPv4 networks and host names ("pypi.org", "*.github.com") it may reach.
    allow: List[str]
    #: Packets of new outbound flows the policy let through, and refused.
    allowed_packets: int
    denied_packets: int

    @staticmethod
    def parse(d: Dict[str, Any]) -> "NetworkInfo":
        policy = d.get("policy") or {}
        return NetworkInfo(
            mode=str(policy.get("mode", "")),
            allow=[str(c) for c in policy.get("allow") or []],
            allowed_packets=int(d.get("allowed_packets", 0)),
            denied_packets=int(d.get("denied_packets", 0)),
        )


@dataclass(frozen=True)
class Lineage:
    """Snapshots and sandboxes joined by their parent edges."""

    snapshots: List[Dict[str, Any]] = field(default_factory=list)
    sandboxes: List[Dict[str, Any]] = field(default_factory=list)

    def parent_of(self, node_id: str) -> Optional[str]:
        """The parent of a snapshot (its source sandbox) or of a sandbox (its parent snapshot)."""
        for s in self.snapshots:
            if s["id"] == node_id:
                return s.get("source")
        for b in self.sandboxes:
            if b["id"] == node_id:
                return b.get("parent_snapshot")
        return None

    @staticmethod
    def parse(d: Dict[str, Any]) -> "Lineage":
        return Lineage(snapshots=list(d.get("snapshots", [])), sandboxes=list(d.get("sandboxes", [])))


class FilesystemEventType(Enum):
    """What happened to a path in a watched directory (E2B's enum, lowercase values)."""

    CHMOD = "chmod"
    CREATE = "create"
    REMOVE = "remove"
    RENAME = "rename"
    WRITE = "write"


@dataclass(frozen=True)
class FilesystemEvent:
    """One change in a watched directory: `name` is the path relative to the watched directory
    (as E2B's), `path` the absolute one."""

    name: str
    type: FilesystemEventType
    path: str = ""

    @staticmethod
    def parse(d: Dict[str, Any], watched: str) -> Optional["FilesystemEvent"]:
        """The event, or None for a type this SDK does not know."""
        try:
            kind = FilesystemEventType(d["type"])
        except ValueError:
            return None
        path = d["name"]
        name = posixpath.relpath(path, watched) if path.startswith("/") else path
        return FilesystemEvent(name=name, type=kind, path=path)
