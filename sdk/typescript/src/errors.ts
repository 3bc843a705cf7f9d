/**
 * Typed errors: one class per kind of failure, each carrying the service's stable code
 * (`{"error": {"code", "message"}}`, docs/service.md). The same classes, mapped the same way,
 * as the Python SDK's exceptions; E2B's JS names (`SandboxError`, `TimeoutError`,
 * `CommandExitError`) are these classes too.
 */

/** Any failure reported by the SDK or the service. E2B's base class is `SandboxError`. */
export class BranchboxError extends Error {
  /** HTTP status of the answer, when there was one. */
  readonly status?: number;
  /** The service's stable code (`not_found`, `conflict`, ...) or the SDK's own. */
  readonly code?: string;

  constructor(message: string, opts: { status?: number; code?: string; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    if (opts.status !== undefined) this.status = opts.status;
    if (opts.code !== undefined) this.code = opts.code;
  }
}

/** E2B's name for the base class. */
export { BranchboxError as SandboxError };

/** The token is missing or wrong (401), or the service did not prove it holds a token read from disk. */
export class AuthenticationError extends BranchboxError {}

/** The request was malformed (400) or a value is not acceptable (422). */
export class InvalidArgumentError extends BranchboxError {}

/** No such sandbox, snapshot, file or route (404). */
export class NotFoundError extends BranchboxError {}

/** The object's state does not allow the operation, e.g. a paused sandbox (409). */
export class ConflictError extends BranchboxError {}

/** The sandbox refused a file operation (403). */
export class PermissionDeniedError extends BranchboxError {}

/** A body or stream is over the service's limit (413). */
export class PayloadTooLargeError extends BranchboxError {}

/** The service or a backend is unavailable (503), or cannot be reached at all. */
export class ServiceUnavailableError extends BranchboxError {}

/** The service runs as many sandboxes as it may (503, code `at_capacity`). */
export class CapacityError extends ServiceUnavailableError {}

/** A request or operation did not finish in time (504, or the client's own limit). */
export class TimeoutError extends BranchboxError {}

/** The service failed (5xx). */
export class ServerError extends BranchboxError {}

/** How a command ended: what `commands.run` resolves to. */
export interface CommandResult {
  stdout: string;
  stderr: string;
  /** Exit code; `null` when it was killed by a signal. */
  exitCode: number | null;
  /** E2B's `error`: standard error when the command failed, else undefined. */
  error?: string;
  /** Terminating signal. */
  signal: number | null;
  /** Killed at its timeout (with its whole process group). */
  timedOut: boolean;
  /** Output beyond the service's cap was dropped. */
  truncated: boolean;
  /** A process of the command was killed at the sandbox's memory limit. */
  oomKilled: boolean;
  /** Run time, ms. */
  durationMs: number;
  /** The checkpoint taken after the command, in step-history mode. */
  checkpoint: string | null;
}

/** A command ended with a non-zero exit code, a signal or its timeout. */
export class CommandExitError extends BranchboxError implements CommandResult {
  readonly result: CommandResult;
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number | null;
  readonly signal: number | null;
  readonly timedOut: boolean;
  readonly truncated: boolean;
  readonly oomKilled: boolean;
  readonly durationMs: number;
  readonly checkpoint: string | null;

  constructor(message: string, result: CommandResult) {
    super(message, { code: "command_exit" });
    this.result = result;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    this.exitCode = result.exitCode;
    this.signal = result.signal;
    this.timedOut = result.timedOut;
    this.truncated = result.truncated;
    this.oomKilled = result.oomKilled;
    this.durationMs = result.durationMs;
    this.checkpoint = result.checkpoint;
  }

  /** E2B's name for standard error. */
  get error(): string {
    return this.stderr;
  }

  /** A `CommandTimeoutError` is a `CommandExitError` too (as the Python SDK's
   *  `CommandTimeoutException` is both), though its class descends from `TimeoutError`. */
  static override [Symbol.hasInstance](x: unknown): boolean {
    if (this === CommandExitError && x instanceof CommandTimeoutError) return true;
    return Function.prototype[Symbol.hasInstance].call(this, x);
  }
}

/**
 * A command ran past its timeout and its process group was killed. A `TimeoutError` (as E2B
 * throws) and, through `instanceof`, a `CommandExitError` with the output so far, so either
 * check catches it.
 */
export class CommandTimeoutError extends TimeoutError implements CommandResult {
  readonly result: CommandResult;
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number | null;
  readonly signal: number | null;
  readonly timedOut: boolean;
  readonly truncated: boolean;
  readonly oomKilled: boolean;
  readonly durationMs: number;
  readonly checkpoint: string | null;

  constructor(message: string, result: CommandResult) {
    super(message, { code: "command_timeout" });
    this.result = result;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
    this.exitCode = result.exitCode;
    this.signal = result.signal;
    this.timedOut = result.timedOut;
    this.truncated = result.truncated;
    this.oomKilled = result.oomKilled;
    this.durationMs = result.durationMs;
    this.checkpoint = result.checkpoint;
  }

  get error(): string {
    return this.stderr;
  }
}

const BY_STATUS: Record<number, new (m: string, o: { status?: number; code?: string }) => BranchboxError> = {
  400: InvalidArgumentError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: InvalidArgumentError,
  503: ServiceUnavailableError,
  504: TimeoutError,
};

/** The error for an answer of the service: by status, as the Python SDK maps them. */
export function fromResponse(status: number, code: string | undefined, message: string): BranchboxError {
  if (status === 503 && code === "at_capacity") return new CapacityError(message, { status, code });
  const cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : BranchboxError);
  return new cls(message, code === undefined ? { status } : { status, code });
}

/** Statuses of the service's codes, for errors that arrive without an HTTP status (a fork
 *  child's failure, a terminal's error message): the table in docs/service.md. */
const STATUS_OF_CODE: Record<string, number> = {
  invalid_id: 400, invalid_port: 400, bad_json: 400, bad_query: 400, bad_body: 400, bad_host: 400,
  unauthorized: 401,
  permission_denied: 403, host_not_allowed: 403, origin_not_allowed: 403,
  not_found: 404, path_not_found: 404,
  conflict: 409, lost: 409, already_exists: 409,
  too_large: 413,
  invalid_body: 422, invalid_input: 422, spawn_failed: 422, sandbox_io: 422,
  backend: 502, agent_unavailable: 502, port_unreachable: 502, port_failed: 502,
  at_capacity: 503, unavailable: 503, too_many_connections: 503,
  timeout: 504,
};

/** The error for a code and message that came without a status (the status its code has). */
export function fromCode(code: string | undefined, message: string): BranchboxError {
  const status = code === undefined ? undefined : STATUS_OF_CODE[code];
  if (status === undefined) return new BranchboxError(message, code === undefined ? {} : { code });
  return fromResponse(status, code, message);
}
