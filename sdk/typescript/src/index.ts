/**
 * branchbox: sandboxes for AI agents that fork, snapshot, checkpoint and roll back.
 *
 * `Sandbox` talks to a running `branchboxd` over HTTP (settings from options,
 * `BRANCHBOX_URL`/`BRANCHBOX_TOKEN`, or the service's files in the data directory); a superset
 * of E2B's JS SDK surface.
 */

export { Sandbox, DEFAULT_USER } from "./sandbox";
export type { FleetCapacity, NetworkPolicy, PullReport, PushReport, SandboxListOpts, SandboxOpts } from "./sandbox";
export { UNANSWERED_HEADER, parseUnanswered } from "./listing";
export type { SandboxList } from "./listing";
export { Commands, CommandHandle, DEFAULT_COMMAND_TIMEOUT_MS } from "./commands";
export type { CommandOpts, CommandStartOpts } from "./commands";
export { Files } from "./files";
export type { FileOpts, WriteData, WriteEntry, WriteOpts } from "./files";
export { Pty, PtyHandle } from "./pty";
export type { PtyCreateOpts, PtyResult, PtySize } from "./pty";
export { DEFAULT_URL, dataDir, proof, resolveConfig, verifyService } from "./config";
export type { ConnectionConfig, ConnectionOpts } from "./config";
export {
  AuthenticationError,
  BranchboxError,
  CapacityError,
  CommandExitError,
  CommandTimeoutError,
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  SandboxError,
  ServerError,
  ServiceUnavailableError,
  TimeoutError,
} from "./errors";
export type {
  CommandResult, EntryInfo, FileType, Lineage, ProcessInfo, SandboxInfo, SandboxState, SnapshotInfo, WriteInfo,
} from "./models";
export { MAX_NAME_BYTES, checkName, checkSnapshotRef } from "./names";
export { ROUTES } from "./wire";
export type { Field, RouteUse, Shape } from "./wire";
