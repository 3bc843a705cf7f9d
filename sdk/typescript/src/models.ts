/** What the service returns, as camelCase objects (E2B's field names where E2B has them). */

import type { CommandResult } from "./errors";
import type {
  COMMAND_RESULT, ENTRY_INFO, ExitEvent, LINEAGE, PROCESS_INFO, SANDBOX_INFO, SNAPSHOT_INFO, WRITTEN, Wire,
} from "./wire";

export type { CommandResult };

export type SandboxState = "running" | "paused" | "lost";

/** A sandbox as the service sees it. */
export interface SandboxInfo {
  sandboxId: string;
  /** E2B's: the template this client created it from, else its image. */
  templateId: string;
  /** E2B's: the same as `templateId`. */
  name: string;
  state: SandboxState;
  backend: string;
  image: string;
  metadata: Record<string, string>;
  startedAt: Date;
  /** When its timeout fires; null while none runs (paused). */
  endAt: Date | null;
  onTimeout: "kill" | "pause";
  /** The snapshot it was restored or forked from. */
  parentSnapshot: string | null;
  limits: { memoryMib: number; cpus: number; pids: number };
  /** E2B's: CPUs and memory (MiB) of its limits. */
  cpuCount: number;
  memoryMB: number;
  /** Token id of its creator. */
  createdBy: string | null;
  /** Why its runtime ended, when `state` is "lost". */
  lostReason: string | null;
  /** The host limit its answers broke, when they did. */
  flagged: string | null;
  /** The fleet node that holds it: given in a listing through a node with peers
   *  (docs/fleet.md), null otherwise. */
  node: string | null;
}

export function parseSandboxInfo(d: Wire<typeof SANDBOX_INFO>, template?: string): SandboxInfo {
  const t = template ?? d.image;
  return {
    sandboxId: d.id,
    templateId: t,
    name: t,
    state: d.state,
    backend: d.backend,
    image: d.image,
    metadata: { ...(d.metadata ?? {}) },
    startedAt: new Date(d.created_ms),
    endAt: d.expires_ms === null ? null : new Date(d.expires_ms),
    onTimeout: d.on_timeout,
    parentSnapshot: d.parent_snapshot,
    limits: { memoryMib: d.limits.memory_mib, cpus: d.limits.cpus, pids: d.limits.pids },
    cpuCount: d.limits.cpus,
    memoryMB: d.limits.memory_mib,
    createdBy: d.created_by,
    lostReason: d.lost_reason,
    flagged: d.flagged,
    node: d.node ?? null,
  };
}

/** An immutable snapshot (or checkpoint, or fork point). */
export interface SnapshotInfo {
  snapshotId: string;
  /** `snapshot`, `checkpoint` or `fork_point`. */
  kind: string;
  name: string | null;
  /** The snapshot its source sandbox came from. */
  parent: string | null;
  /** The sandbox it was taken of. */
  source: string | null;
  backend: string;
  image: string;
  createdAt: Date;
  sizeBytes: number;
  deleted: boolean;
}

export function parseSnapshotInfo(d: Wire<typeof SNAPSHOT_INFO>): SnapshotInfo {
  return {
    snapshotId: d.id,
    kind: d.kind,
    name: d.name,
    parent: d.parent,
    source: d.source,
    backend: d.backend,
    image: d.image,
    createdAt: new Date(d.created_ms),
    sizeBytes: d.size_bytes,
    deleted: d.deleted,
  };
}

export function parseCommandResult(
  d: Wire<typeof COMMAND_RESULT> | ExitEvent,
  stdout?: string,
  stderr?: string,
): CommandResult {
  const out = stdout ?? ("stdout" in d ? d.stdout : "");
  const err = stderr ?? ("stderr" in d ? d.stderr : "");
  const r: CommandResult = {
    stdout: out,
    stderr: err,
    exitCode: d.exit_code,
    signal: d.signal,
    timedOut: d.timed_out,
    truncated: d.truncated,
    oomKilled: d.oom_killed,
    durationMs: d.duration_ms,
    checkpoint: d.checkpoint ?? null,
  };
  if (d.exit_code !== 0) r.error = err;
  return r;
}

/** A background process. */
export interface ProcessInfo {
  pid: number;
  /** What was started (argv, or `["/bin/sh", "-c", line]`). */
  argv: string[];
  /** E2B's: the command (argv[0]) and its arguments. */
  cmd: string;
  args: string[];
  running: boolean;
  exitCode: number | null;
  signal: number | null;
}

export function parseProcessInfo(d: Wire<typeof PROCESS_INFO>): ProcessInfo {
  return {
    pid: d.pid,
    argv: d.argv,
    cmd: d.argv[0] ?? "",
    args: d.argv.slice(1),
    running: d.running,
    exitCode: d.exit_code,
    signal: d.signal,
  };
}

export type FileType = "file" | "dir" | "symlink" | "other";

/** A file or directory in a sandbox. */
export interface EntryInfo {
  name: string;
  path: string;
  type: FileType;
  size: number;
  /** Permission bits. */
  mode: number;
  /** E2B's: the permission bits as `rwxr-xr-x`. */
  permissions: string;
  modifiedTime: Date;
}

function permissions(mode: number): string {
  let s = "";
  for (let shift = 6; shift >= 0; shift -= 3) {
    const b = (mode >> shift) & 7;
    s += (b & 4 ? "r" : "-") + (b & 2 ? "w" : "-") + (b & 1 ? "x" : "-");
  }
  return s;
}

export function parseEntryInfo(d: Wire<typeof ENTRY_INFO>): EntryInfo {
  return {
    name: d.name,
    path: d.path,
    type: d.kind,
    size: d.size,
    mode: d.mode,
    permissions: permissions(d.mode),
    modifiedTime: new Date(Math.floor(d.mtime_ns / 1e6)),
  };
}

/** A file written: E2B's `WriteInfo` (`name`, `type`, `path`) and its size. */
export interface WriteInfo {
  name: string;
  type: "file";
  path: string;
  size: number;
}

export function parseWriteInfo(d: Wire<typeof WRITTEN>): WriteInfo {
  const name = d.path.replace(/\/+$/, "").split("/").pop() ?? d.path;
  return { name, type: "file", path: d.path, size: d.size };
}

/** Snapshots and sandboxes joined by their parent edges. */
export interface Lineage {
  snapshots: {
    snapshotId: string;
    parent: string | null;
    source: string | null;
    kind: string;
    name: string | null;
    createdAt: Date;
    deleted: boolean;
  }[];
  sandboxes: { sandboxId: string; parentSnapshot: string | null; state: SandboxState }[];
  /** The parent of a snapshot (its source sandbox) or of a sandbox (its parent snapshot). */
  parentOf(nodeId: string): string | null;
}

export function parseLineage(d: Wire<typeof LINEAGE>): Lineage {
  const snapshots = d.snapshots.map((s) => ({
    snapshotId: s.id,
    parent: s.parent,
    source: s.source,
    kind: s.kind,
    name: s.name,
    createdAt: new Date(s.created_ms),
    deleted: s.deleted,
  }));
  const sandboxes = d.sandboxes.map((b) => ({ sandboxId: b.id, parentSnapshot: b.parent_snapshot, state: b.state }));
  return {
    snapshots,
    sandboxes,
    parentOf(nodeId: string): string | null {
      const s = snapshots.find((x) => x.snapshotId === nodeId);
      if (s) return s.source;
      const b = sandboxes.find((x) => x.sandboxId === nodeId);
      return b ? b.parentSnapshot : null;
    },
  };
}
