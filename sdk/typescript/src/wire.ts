/**
 * The service's JSON, as far as this SDK uses it: one table of the routes it calls and the
 * fields it sends and reads, with their JSON types. The TypeScript types the SDK parses answers
 * with are derived from this table (`Wire<...>`), so a field the SDK reads is a field listed
 * here; `test/openapi.test.ts` checks every entry against the live `/openapi.json`, so a field
 * the service drops, renames or retypes fails that test.
 *
 * Field types: `"string"`, `"integer"`, `"number"`, `"boolean"`, `"string[]"`, `"map"` (an
 * object of strings); a trailing `?` means nullable (answers) or optional (requests);
 * `["obj", SHAPE]`, `["arr", SHAPE]` and `["enum", [values]]` nest.
 */

type Base = "string" | "integer" | "number" | "boolean" | "string[]" | "map";
export type Field =
  | Base
  | `${Base}?`
  | readonly ["obj" | "obj?" | "arr", Shape]
  | readonly ["enum" | "enum?", readonly string[]];
export type Shape = { readonly [field: string]: Field };

type BaseType<F> = F extends "string"
  ? string
  : F extends "integer" | "number"
    ? number
    : F extends "boolean"
      ? boolean
      : F extends "string[]"
        ? string[]
        : F extends "map"
          ? Record<string, string>
          : never;

/** The TypeScript type of one field. */
export type FieldType<F> = F extends `${infer B}?`
  ? BaseType<B> | null
  : F extends Base
    ? BaseType<F>
    : F extends readonly ["obj", infer S]
      ? Wire<S>
      : F extends readonly ["obj?", infer S]
        ? Wire<S> | null
        : F extends readonly ["arr", infer S]
          ? Wire<S>[]
          : F extends readonly ["enum", readonly (infer V)[]]
            ? V
            : F extends readonly ["enum?", readonly (infer V)[]]
              ? V | null
              : never;

/** An answer of this shape. */
export type Wire<S> = { -readonly [K in keyof S]: FieldType<S[K]> };
/** A request body of this shape: every field may be left out. */
export type Body<S> = { -readonly [K in keyof S]?: FieldType<S[K]> };

const STATES = ["running", "paused", "lost"] as const;

export const LIMITS_INFO = { memory_mib: "integer", cpus: "integer", pids: "integer" } as const;

export const SANDBOX_INFO = {
  id: "string",
  state: ["enum", STATES],
  backend: "string",
  image: "string",
  created_ms: "integer",
  parent_snapshot: "string?",
  limits: ["obj", LIMITS_INFO],
  metadata: "map",
  expires_ms: "integer?",
  on_timeout: ["enum", ["kill", "pause"]],
  created_by: "string?",
  lost_reason: "string?",
  flagged: "string?",
  node: "string?",
} as const;

export const SNAPSHOT_INFO = {
  id: "string",
  parent: "string?",
  source: "string?",
  backend: "string",
  image: "string",
  kind: "string",
  name: "string?",
  created_ms: "integer",
  size_bytes: "integer",
  deleted: "boolean",
} as const;

export const NETWORK_POLICY = {
  mode: ["enum", ["internet", "deny_all", "allow_list"]],
  allow: "string[]?",
} as const;

export const CREATE_SANDBOX = {
  template: "string?",
  snapshot_id: "string?",
  image: "string?",
  timeout: "number?",
  on_timeout: ["enum?", ["kill", "pause"]],
  metadata: "map?",
  envs: "map?",
  backend: ["enum?", ["auto", "gvisor", "microvm"]],
  memory_mib: "integer?",
  cpus: "integer?",
  pids: "integer?",
  network: ["obj?", NETWORK_POLICY],
  allow_internet_access: "boolean?",
} as const;

export const CONNECT_SANDBOX = { timeout: "number?" } as const;
export const SET_TIMEOUT = { timeout: "number" } as const;
export const FORK_SANDBOX = { count: "integer?" } as const;
export const ERROR_DETAIL = { code: "string", message: "string" } as const;
export const FORK_CHILD = { ok: "boolean", sandbox: ["obj?", SANDBOX_INFO], error: ["obj?", ERROR_DETAIL] } as const;
export const FORK_RESULT = { snapshot: ["obj", SNAPSHOT_INFO], children: ["arr", FORK_CHILD] } as const;
export const ERROR_BODY = { error: ["obj", ERROR_DETAIL] } as const;
export const TAKE_SNAPSHOT = { name: "string?" } as const;
export const ROLLBACK = { checkpoint: "string" } as const;
export const HOST_INFO = { host: "string", port: "integer", address: "string", proxy_path: "string" } as const;

export const LINEAGE_SNAPSHOT = {
  id: "string",
  parent: "string?",
  source: "string?",
  kind: "string",
  name: "string?",
  created_ms: "integer",
  deleted: "boolean",
} as const;
export const LINEAGE_SANDBOX = { id: "string", parent_snapshot: "string?", state: ["enum", STATES] } as const;
export const LINEAGE = { snapshots: ["arr", LINEAGE_SNAPSHOT], sandboxes: ["arr", LINEAGE_SANDBOX] } as const;

export const RUN_COMMAND = {
  cmd: "string?",
  argv: "string[]?",
  envs: "map?",
  cwd: "string?",
  timeout: "number?",
  stdin: "string?",
  user: "string?",
} as const;

export const COMMAND_RESULT = {
  stdout: "string",
  stderr: "string",
  exit_code: "integer?",
  signal: "integer?",
  timed_out: "boolean",
  truncated: "boolean",
  oom_killed: "boolean",
  duration_ms: "integer",
  checkpoint: "string?",
} as const;

export const PROCESS_STARTED = { pid: "integer" } as const;
export const PROCESS_INFO = {
  pid: "integer",
  argv: "string[]",
  running: "boolean",
  exit_code: "integer?",
  signal: "integer?",
} as const;
export const SEND_SIGNAL = { signal: "integer", group: "boolean?" } as const;
export const WAIT_PROCESS = { timeout: "number?" } as const;
export const WAIT_RESULT = { running: "boolean", result: ["obj?", COMMAND_RESULT] } as const;

export const ENTRY_INFO = {
  name: "string",
  path: "string",
  kind: ["enum", ["file", "dir", "symlink", "other"]],
  size: "integer",
  mode: "integer",
  mtime_ns: "integer",
} as const;
export const WRITTEN = { path: "string", size: "integer" } as const;
export const RENAME_PATH = { from: "string", to: "string", user: "string?" } as const;
export const MAKE_DIR = { path: "string", parents: "boolean?", user: "string?" } as const;
export const MADE = { created: "boolean" } as const;
export const CHALLENGE = { listen: "string", proofs: "string[]" } as const;

export const PUSH_ANSWER = {
  snapshot: "string",
  chunks: "integer",
  sent_chunks: "integer",
  sent_bytes: "integer",
  skipped_bytes: "integer",
  seconds: "number",
} as const;
export const PULL_BODY = { id: "string", peer: "string?" } as const;
export const PULL_ANSWER = {
  snapshot: "string",
  chunks: "integer",
  fetched_bytes: "integer",
  reused_bytes: "integer",
  peer_bytes: "integer",
  s3_bytes: "integer",
  peer_error: "string?",
  seconds: "number",
} as const;
export const CAPACITY = { sandboxes: "integer", max_sandboxes: "integer", room: "integer" } as const;

export type Method = "GET" | "POST" | "PUT" | "DELETE";

/** One route the SDK calls: its query parameters, request body and JSON answer. */
export interface RouteUse {
  readonly method: Method;
  readonly path: string;
  readonly query?: readonly string[];
  readonly request?: Shape;
  /** The JSON answer: an object, or (`list`) an array of them. */
  readonly response?: Shape;
  readonly list?: boolean;
}

/** Every route this SDK calls, and what of it it uses. */
export const ROUTES: readonly RouteUse[] = [
  { method: "GET", path: "/v1/auth/challenge", query: ["nonce"], response: CHALLENGE },
  { method: "POST", path: "/v1/sandboxes", request: CREATE_SANDBOX, response: SANDBOX_INFO },
  { method: "GET", path: "/v1/sandboxes", query: ["metadata", "state", "local"], response: SANDBOX_INFO, list: true },
  { method: "GET", path: "/v1/sandboxes/{id}", response: SANDBOX_INFO },
  { method: "DELETE", path: "/v1/sandboxes/{id}" },
  { method: "POST", path: "/v1/sandboxes/{id}/connect", request: CONNECT_SANDBOX, response: SANDBOX_INFO },
  { method: "POST", path: "/v1/sandboxes/{id}/pause", response: SANDBOX_INFO },
  { method: "POST", path: "/v1/sandboxes/{id}/timeout", request: SET_TIMEOUT },
  { method: "POST", path: "/v1/sandboxes/{id}/fork", request: FORK_SANDBOX, response: FORK_RESULT },
  { method: "GET", path: "/v1/sandboxes/{id}/hosts/{port}", response: HOST_INFO },
  { method: "POST", path: "/v1/sandboxes/{id}/snapshots", request: TAKE_SNAPSHOT, response: SNAPSHOT_INFO },
  { method: "POST", path: "/v1/sandboxes/{id}/checkpoints", request: TAKE_SNAPSHOT, response: SNAPSHOT_INFO },
  { method: "GET", path: "/v1/sandboxes/{id}/checkpoints", response: SNAPSHOT_INFO, list: true },
  { method: "POST", path: "/v1/sandboxes/{id}/rollback", request: ROLLBACK, response: SANDBOX_INFO },
  { method: "GET", path: "/v1/snapshots", response: SNAPSHOT_INFO, list: true },
  { method: "DELETE", path: "/v1/snapshots/{snapshot}", query: ["cascade"] },
  { method: "POST", path: "/v1/snapshots/{snapshot}/push", response: PUSH_ANSWER },
  { method: "POST", path: "/v1/snapshots/pull", request: PULL_BODY, response: PULL_ANSWER },
  { method: "GET", path: "/v1/fleet/capacity", response: CAPACITY },
  { method: "GET", path: "/v1/lineage", query: ["sandbox"], response: LINEAGE },
  { method: "POST", path: "/v1/sandboxes/{id}/commands", request: RUN_COMMAND, response: COMMAND_RESULT },
  { method: "POST", path: "/v1/sandboxes/{id}/commands/stream", request: RUN_COMMAND },
  { method: "POST", path: "/v1/sandboxes/{id}/processes", request: RUN_COMMAND, response: PROCESS_STARTED },
  { method: "GET", path: "/v1/sandboxes/{id}/processes", response: PROCESS_INFO, list: true },
  { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/signal", request: SEND_SIGNAL },
  { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/wait", request: WAIT_PROCESS, response: WAIT_RESULT },
  { method: "GET", path: "/v1/sandboxes/{id}/files", query: ["path", "user"] },
  { method: "PUT", path: "/v1/sandboxes/{id}/files", query: ["path", "mode", "user"], response: WRITTEN },
  { method: "DELETE", path: "/v1/sandboxes/{id}/files", query: ["path", "recursive", "user"] },
  { method: "GET", path: "/v1/sandboxes/{id}/files/list", query: ["path", "user"], response: ENTRY_INFO, list: true },
  { method: "GET", path: "/v1/sandboxes/{id}/files/stat", query: ["path", "user"], response: ENTRY_INFO },
  { method: "POST", path: "/v1/sandboxes/{id}/files/rename", request: RENAME_PATH },
  { method: "POST", path: "/v1/sandboxes/{id}/files/mkdir", request: MAKE_DIR, response: MADE },
];

/** The fields of a streamed command's `exit` event (documented in `StreamEvent`'s text, not
 *  as a schema: the SDK reads them with the command result's types). */
export type ExitEvent = Omit<Wire<typeof COMMAND_RESULT>, "stdout" | "stderr">;
