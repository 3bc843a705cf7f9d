/** `Sandbox`: one sandbox behind a branchbox service, with `commands`, `files` and `pty`. */

import { Commands } from "./commands";
import { resolveConfig, type ConnectionOpts } from "./config";
import { BranchboxError, InvalidArgumentError, NotFoundError, fromCode } from "./errors";
import { Files } from "./files";
import { Http, sandboxPath, seg, type Call } from "./http";
import { sandboxList, type SandboxList } from "./listing";
import {
  parseLineage, parseSandboxInfo, parseSnapshotInfo, type Lineage, type SandboxInfo, type SandboxState, type SnapshotInfo,
} from "./models";
import { checkName, checkSnapshotRef } from "./names";
import { Pty } from "./pty";
import type {
  Body, CAPACITY, CONNECT_SANDBOX, CREATE_SANDBOX, FORK_RESULT, FORK_SANDBOX, HOST_INFO, LINEAGE, NETWORK_POLICY, PULL_ANSWER,
  PULL_BODY, PUSH_ANSWER, ROLLBACK, SANDBOX_INFO, SET_TIMEOUT, SNAPSHOT_INFO, TAKE_SNAPSHOT, Wire,
} from "./wire";

/** The account commands and file operations use unless told otherwise, as in E2B: the default
 *  image has it, with home /home/user and passwordless sudo. */
export const DEFAULT_USER = "user";
/** E2B's name for its default template; here the default image. */
const BASE_TEMPLATE = "base";

/** A networked sandbox's egress policy (docs/network.md). */
export interface NetworkPolicy {
  mode: "internet" | "deny_all" | "allow_list";
  /** With "allow_list": the IPv4 networks and host names it may reach. */
  allow?: string[];
}

/** What `Sandbox.create` takes. */
export interface SandboxOpts extends ConnectionOpts {
  /** A template (`GET /v1/templates`); E2B's `base` is the default image. */
  template?: string;
  /** An image: `default`, `minimal` or one imported with `branchbox image import`. */
  image?: string;
  /** Start from this snapshot (id or name) instead: its full state, processes included. */
  snapshotId?: string;
  /** Killed (or paused, with `onTimeout: "pause"`) this long after creation, ms (default 300 000). */
  timeoutMs?: number;
  onTimeout?: "kill" | "pause";
  /** Labels to find it by (`Sandbox.list({query: {metadata}})`). */
  metadata?: Record<string, string>;
  /** Environment of every command run in it. */
  envs?: Record<string, string>;
  backend?: "auto" | "gvisor" | "microvm";
  memoryMib?: number;
  cpus?: number;
  pids?: number;
  /** E2B's switch: true gives it the public internet (private ranges refused), false a network
   *  that reaches nothing but still serves its ports. Without it (or `network`) it has none. */
  allowInternetAccess?: boolean;
  network?: NetworkPolicy;
  /** The account commands and files use by default (`user`; root for another image or a
   *  named template, which may have no `user` account). */
  user?: string;
}

/** What `Sandbox.list` takes. */
export interface SandboxListOpts extends ConnectionOpts {
  /** E2B's query: metadata pairs all of which a sandbox has, and its state (or states). */
  query?: { metadata?: Record<string, string>; state?: SandboxState | SandboxState[] };
  /** Through a node with fleet peers: only that node's own sandboxes (else every node's). */
  local?: boolean;
}

/** What a push of a snapshot to the service's S3 store did (docs/remote.md). */
export interface PushReport {
  snapshot: string;
  /** Chunks in its manifest. */
  chunks: number;
  sentChunks: number;
  sentBytes: number;
  /** Bytes the store had already. */
  skippedBytes: number;
  seconds: number;
}

/** What a pull of a pushed snapshot did: `fetchedBytes` = `peerBytes` + `s3Bytes`. */
export interface PullReport {
  snapshot: string;
  chunks: number;
  fetchedBytes: number;
  /** Bytes copied from snapshots the service had already. */
  reusedBytes: number;
  peerBytes: number;
  s3Bytes: number;
  /** Why the pull stopped asking the peer, when it had one and it failed. */
  peerError: string | null;
  seconds: number;
}

/** A service's sandboxes against its `--max-sandboxes` (`GET /v1/fleet/capacity`). */
export interface FleetCapacity {
  /** Sandboxes it holds (running or paused). */
  sandboxes: number;
  maxSandboxes: number;
  /** How many more it would start now. */
  room: number;
}

/** A push or pull moves a snapshot's bytes to or from S3: up to an hour. */
const TRANSFER_TIMEOUT_MS = 3_600_000;

/** The account a sandbox's commands and files use when a call names none. */
function defaultUserOf(user?: string, template?: string, image?: string): string | undefined {
  if (user) return user;
  if ((template !== undefined && template !== BASE_TEMPLATE && template !== "default") ||
      (image !== undefined && image !== "default")) {
    return undefined;
  }
  return DEFAULT_USER;
}

function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new InvalidArgumentError(`port ${port}: give 1 to 65535`, { code: "invalid_port" });
  }
  return port;
}

function seconds(what: string, ms: number): number {
  if (typeof ms !== "number" || !(ms > 0) || !Number.isFinite(ms)) {
    throw new InvalidArgumentError(`${what} ${ms}: give a positive number of milliseconds`);
  }
  return ms / 1000;
}

export class Sandbox {
  /** Its id (`sbx-<16 hex>`). */
  readonly sandboxId: string;
  /** Commands: `run`, background processes. */
  readonly commands: Commands;
  /** Files: read, write, list, exists, remove, makeDir, rename. */
  readonly files: Files;
  /** Terminals (`GET /v1/sandboxes/{id}/pty`, a WebSocket). */
  readonly pty: Pty;
  /** The account commands run as and files belong to unless a call names another. */
  readonly defaultUser: string | undefined;
  /** @internal */
  readonly _http: Http;
  private readonly template: string | undefined;

  /** @internal Use `Sandbox.create` or `Sandbox.connect`. */
  constructor(sandboxId: string, http: Http, opts: { defaultUser?: string | undefined; template?: string } = {}) {
    this.sandboxId = sandboxId;
    this._http = http;
    this.template = opts.template;
    this.defaultUser = "defaultUser" in opts ? opts.defaultUser : DEFAULT_USER;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.pty = new Pty(this);
  }

  /** @internal An absolute path as is; a relative one under the user's home, as E2B resolves it. */
  _abs(path: string, user: string | undefined = this.defaultUser): string {
    if (typeof path !== "string" || !path) throw new InvalidArgumentError(`path ${JSON.stringify(path)} must be a non-empty string`);
    if (path.startsWith("/")) return path;
    return `${user === undefined || user === "root" ? "/root" : `/home/${user}`}/${path}`;
  }

  /** The URL of the service this sandbox is reached through. */
  get url(): string {
    return this._http.cfg.url;
  }

  /**
   * Starts a sandbox from the default image, a template, an image or a snapshot; it is killed
   * `timeoutMs` after creation (default 300 000) unless `setTimeout` extends it. Also
   * `Sandbox.create("template", opts)`, as E2B's.
   */
  static async create(opts?: SandboxOpts): Promise<Sandbox>;
  static async create(template: string, opts?: SandboxOpts): Promise<Sandbox>;
  static async create(a?: string | SandboxOpts, b?: SandboxOpts): Promise<Sandbox> {
    const opts: SandboxOpts = typeof a === "string" ? { ...b, template: a } : { ...a };
    const http = new Http(await resolveConfig(opts));
    const body: Body<typeof CREATE_SANDBOX> = {};
    if (opts.template !== undefined) body.template = opts.template === BASE_TEMPLATE ? "default" : opts.template;
    if (opts.snapshotId !== undefined) body.snapshot_id = checkSnapshotRef(opts.snapshotId);
    if (opts.image !== undefined) body.image = opts.image;
    if (opts.timeoutMs !== undefined) body.timeout = seconds("timeoutMs", opts.timeoutMs);
    if (opts.onTimeout !== undefined) body.on_timeout = opts.onTimeout;
    if (opts.metadata !== undefined) body.metadata = { ...opts.metadata };
    if (opts.envs !== undefined) body.envs = { ...opts.envs };
    if (opts.backend !== undefined) body.backend = opts.backend;
    if (opts.memoryMib !== undefined) body.memory_mib = opts.memoryMib;
    if (opts.cpus !== undefined) body.cpus = opts.cpus;
    if (opts.pids !== undefined) body.pids = opts.pids;
    if (opts.network !== undefined) {
      // `allow` is left out unless given: the service refuses it with any mode but allow_list.
      const { mode, allow } = opts.network;
      body.network = (allow === undefined ? { mode } : { mode, allow: [...allow] }) as Wire<typeof NETWORK_POLICY>;
    }
    if (opts.allowInternetAccess !== undefined) body.allow_internet_access = opts.allowInternetAccess;
    const d = await http.json<Wire<typeof SANDBOX_INFO>>({ method: "POST", path: "/v1/sandboxes", json: body });
    const s: { defaultUser: string | undefined; template?: string } = {
      defaultUser: defaultUserOf(opts.user, opts.template, opts.image),
    };
    if (opts.template !== undefined) s.template = opts.template;
    return new Sandbox(d.id, http, s);
  }

  /** Connects to an existing sandbox, resuming it when paused and restarting its timeout
   *  (`timeoutMs` sets a new one). */
  static async connect(sandboxId: string, opts: ConnectionOpts & { timeoutMs?: number; user?: string } = {}): Promise<Sandbox> {
    const http = new Http(await resolveConfig(opts));
    const body: Body<typeof CONNECT_SANDBOX> = {};
    if (opts.timeoutMs !== undefined) body.timeout = seconds("timeoutMs", opts.timeoutMs);
    const d = await http.json<Wire<typeof SANDBOX_INFO>>({ method: "POST", path: sandboxPath(sandboxId, "/connect"), json: body });
    return new Sandbox(d.id, http, { defaultUser: defaultUserOf(opts.user) });
  }

  /** Sandboxes (ready pool members are not listed), optionally only those with all the given
   *  metadata pairs and in the given state(s). Through a node with fleet peers, every node's,
   *  each with its `node` (`local: true`: that node's own only); the answer's `unanswered` and
   *  `partial` say which peers did not answer, whose sandboxes it lacks. */
  static async list(opts: SandboxListOpts = {}): Promise<SandboxList> {
    const http = new Http(await resolveConfig(opts));
    const q = opts.query ?? {};
    const states = q.state === undefined ? undefined : Array.isArray(q.state) ? q.state : [q.state];
    const query: Record<string, string> = {};
    if (q.metadata && Object.keys(q.metadata).length) query.metadata = new URLSearchParams(q.metadata).toString();
    if (states?.length === 1) query.state = states[0] as string;
    if (opts.local) query.local = "true";
    const c: Call = { method: "GET", path: "/v1/sandboxes", query };
    const r = await http.call(c);
    let d: Wire<typeof SANDBOX_INFO>[];
    try {
      d = (await r.json()) as Wire<typeof SANDBOX_INFO>[];
    } catch (e) {
      throw http.transportError(c, e);
    }
    const found = d.map((x) => parseSandboxInfo(x)).filter((i) => states === undefined || states.includes(i.state));
    return sandboxList(found, r.headers);
  }

  /** Pushes a snapshot (id or name) to the service's S3 store: the chunks the store lacks, then
   *  its manifest (docs/remote.md). */
  static async pushSnapshot(snapshot: string, opts: ConnectionOpts = {}): Promise<PushReport> {
    const http = new Http(await resolveConfig(opts));
    const path = `/v1/snapshots/${seg(checkSnapshotRef(snapshot))}/push`;
    const d = await http.json<Wire<typeof PUSH_ANSWER>>({ method: "POST", path, timeoutMs: TRANSFER_TIMEOUT_MS });
    return {
      snapshot: d.snapshot,
      chunks: d.chunks,
      sentChunks: d.sent_chunks,
      sentBytes: d.sent_bytes,
      skippedBytes: d.skipped_bytes,
      seconds: d.seconds,
    };
  }

  /** Pulls a pushed snapshot into the service under the same id (`Sandbox.create({snapshotId})`
   *  then starts it). With `peer` (a node of the service's peers file that holds it), each
   *  chunk comes from that node first and from S3 when it fails. */
  static async pullSnapshot(snapshotId: string, opts: ConnectionOpts & { peer?: string } = {}): Promise<PullReport> {
    const http = new Http(await resolveConfig(opts));
    const json: Body<typeof PULL_BODY> = { id: checkSnapshotRef(snapshotId) };
    if (opts.peer !== undefined) json.peer = opts.peer;
    const d = await http.json<Wire<typeof PULL_ANSWER>>({
      method: "POST", path: "/v1/snapshots/pull", json, timeoutMs: TRANSFER_TIMEOUT_MS,
    });
    return {
      snapshot: d.snapshot,
      chunks: d.chunks,
      fetchedBytes: d.fetched_bytes,
      reusedBytes: d.reused_bytes,
      peerBytes: d.peer_bytes,
      s3Bytes: d.s3_bytes,
      peerError: d.peer_error,
      seconds: d.seconds,
    };
  }

  /** The service's sandboxes against its `--max-sandboxes`, and how many more it would start. */
  static async fleetCapacity(opts: ConnectionOpts = {}): Promise<FleetCapacity> {
    const http = new Http(await resolveConfig(opts));
    const d = await http.json<Wire<typeof CAPACITY>>({ method: "GET", path: "/v1/fleet/capacity" });
    return { sandboxes: d.sandboxes, maxSandboxes: d.max_sandboxes, room: d.room };
  }

  /** Kills a sandbox by id; false when it was already gone. */
  static async kill(sandboxId: string, opts: ConnectionOpts = {}): Promise<boolean> {
    return new Sandbox(sandboxId, new Http(await resolveConfig(opts))).kill();
  }

  /** Sets a sandbox's timeout by id, counted from now. */
  static async setTimeout(sandboxId: string, timeoutMs: number, opts: ConnectionOpts = {}): Promise<void> {
    return new Sandbox(sandboxId, new Http(await resolveConfig(opts))).setTimeout(timeoutMs);
  }

  /** A sandbox's info by id. */
  static async getInfo(sandboxId: string, opts: ConnectionOpts = {}): Promise<SandboxInfo> {
    return new Sandbox(sandboxId, new Http(await resolveConfig(opts))).getInfo();
  }

  /** Every snapshot. */
  static async listSnapshots(opts: ConnectionOpts = {}): Promise<SnapshotInfo[]> {
    const http = new Http(await resolveConfig(opts));
    const d = await http.json<Wire<typeof SNAPSHOT_INFO>[]>({ method: "GET", path: "/v1/snapshots" });
    return d.map(parseSnapshotInfo);
  }

  /** Deletes a snapshot (with `cascade`, also the snapshots descending from it). */
  static async deleteSnapshot(snapshotId: string, opts: ConnectionOpts & { cascade?: boolean } = {}): Promise<void> {
    const http = new Http(await resolveConfig(opts));
    await http.empty({
      method: "DELETE",
      path: `/v1/snapshots/${seg(checkSnapshotRef(snapshotId))}`,
      query: { cascade: opts.cascade ?? false },
    });
  }

  /** Its state, metadata and timeout now. */
  async getInfo(): Promise<SandboxInfo> {
    const d = await this._http.json<Wire<typeof SANDBOX_INFO>>({ method: "GET", path: sandboxPath(this.sandboxId) });
    return parseSandboxInfo(d, this.template);
  }

  /** True while it is running (not paused, lost or gone). */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.getInfo()).state === "running";
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Destroys it; false when it was already gone. */
  async kill(): Promise<boolean> {
    try {
      await this._http.empty({ method: "DELETE", path: sandboxPath(this.sandboxId) });
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }

  /** Sets the timeout to `timeoutMs` from now; 0 ends the sandbox now (its timeout action,
   *  kill or pause, runs within a second), as E2B's `setTimeout(0)` does. */
  async setTimeout(timeoutMs: number): Promise<void> {
    const timeout = timeoutMs === 0 ? 0 : seconds("timeoutMs", timeoutMs);
    const body: Body<typeof SET_TIMEOUT> = { timeout };
    await this._http.empty({ method: "POST", path: sandboxPath(this.sandboxId, "/timeout"), json: body });
  }

  /** Pauses it (its timeout stops); `Sandbox.connect(id)` resumes it. */
  async pause(): Promise<SandboxInfo> {
    const d = await this._http.json<Wire<typeof SANDBOX_INFO>>({ method: "POST", path: sandboxPath(this.sandboxId, "/pause") });
    return parseSandboxInfo(d, this.template);
  }

  /**
   * `HOST:PORT` where the host branchboxd runs on reaches a server listening on `port` in this
   * networked sandbox (E2B's `getHost`; prefix `http://`). A sandbox without a network has
   * none: the service's error says so.
   */
  async getHost(port: number): Promise<string> {
    const d = await this._http.json<Wire<typeof HOST_INFO>>({
      method: "GET",
      path: sandboxPath(this.sandboxId, `/hosts/${checkPort(port)}`),
    });
    return d.address;
  }

  /** The URL of `port` through branchboxd's proxy; send the service's token with it. */
  proxyUrl(port: number): string {
    return `${this._http.cfg.url}${sandboxPath(this.sandboxId, `/ports/${checkPort(port)}/`)}`;
  }

  /** Forks `count` children that continue from this instant (processes, memory, files); one
   *  `Sandbox`, or the error that child failed with, per child, in order. */
  async fork(opts: { count?: number } | number = {}): Promise<(Sandbox | BranchboxError)[]> {
    const count = typeof opts === "number" ? opts : opts.count;
    const body: Body<typeof FORK_SANDBOX> = count === undefined ? {} : { count };
    const d = await this._http.json<Wire<typeof FORK_RESULT>>({ method: "POST", path: sandboxPath(this.sandboxId, "/fork"), json: body });
    return d.children.map((c) => {
      if (c.ok && c.sandbox) {
        // A child runs as its parent does, and was made from the same template.
        const o: { defaultUser: string | undefined; template?: string } = { defaultUser: this.defaultUser };
        if (this.template !== undefined) o.template = this.template;
        return new Sandbox(c.sandbox.id, this._http, o);
      }
      return fromCode(c.error?.code, c.error?.message ?? "the child did not start");
    });
  }

  private async snapshotCall(route: string, name: string | undefined): Promise<SnapshotInfo> {
    const body: Body<typeof TAKE_SNAPSHOT> = name === undefined ? {} : { name: checkName("snapshot name", name) };
    const d = await this._http.json<Wire<typeof SNAPSHOT_INFO>>({ method: "POST", path: sandboxPath(this.sandboxId, route), json: body });
    return parseSnapshotInfo(d);
  }

  /** Captures its full state; it keeps running. `Sandbox.create({snapshotId})` starts it again. */
  async createSnapshot(opts: { name?: string } = {}): Promise<SnapshotInfo> {
    return this.snapshotCall("/snapshots", opts.name);
  }

  /** Takes a checkpoint to roll back to later. */
  async checkpoint(opts: { name?: string } = {}): Promise<SnapshotInfo> {
    return this.snapshotCall("/checkpoints", opts.name);
  }

  /** Its checkpoints, oldest first. */
  async checkpoints(): Promise<SnapshotInfo[]> {
    const d = await this._http.json<Wire<typeof SNAPSHOT_INFO>[]>({ method: "GET", path: sandboxPath(this.sandboxId, "/checkpoints") });
    return d.map(parseSnapshotInfo);
  }

  /** Returns it, in place (same id), to one of its checkpoints: processes, memory and files. */
  async rollback(snapshotId: string): Promise<SandboxInfo> {
    const body: Body<typeof ROLLBACK> = { checkpoint: checkSnapshotRef(snapshotId) };
    const d = await this._http.json<Wire<typeof SANDBOX_INFO>>({ method: "POST", path: sandboxPath(this.sandboxId, "/rollback"), json: body });
    return parseSandboxInfo(d, this.template);
  }

  /** The part of the lineage connected to it: its ancestors and descendants. */
  async lineage(): Promise<Lineage> {
    const d = await this._http.json<Wire<typeof LINEAGE>>({ method: "GET", path: "/v1/lineage", query: { sandbox: this.sandboxId } });
    return parseLineage(d);
  }
}
