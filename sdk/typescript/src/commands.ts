/** Commands in one sandbox: run to completion (collected or streamed), background processes. */

import { CommandExitError, CommandTimeoutError, NotFoundError, TimeoutError, InvalidArgumentError } from "./errors";
import type { CommandResult } from "./errors";
import { COMMAND_MARGIN_MS, sandboxPath } from "./http";
import { parseCommandResult, parseProcessInfo, type ProcessInfo } from "./models";
import { StreamDecoder, type OutputCallback } from "./sse";
import type { Sandbox } from "./sandbox";
import type {
  Body, COMMAND_RESULT, PROCESS_INFO, PROCESS_STARTED, RUN_COMMAND, SEND_SIGNAL, WAIT_PROCESS, WAIT_RESULT, Wire,
} from "./wire";

/** A command's default time limit, ms (E2B's too). */
export const DEFAULT_COMMAND_TIMEOUT_MS = 60_000;
/** What `timeoutMs: 0` (no limit, in E2B) becomes for a command run to completion: the
 *  service's longest command time, 3600 s (docs/service.md). */
const LONGEST_COMMAND_MS = 3_600_000;
/** How long one wait request for a background process lasts, ms. */
const WAIT_ROUND_MS = 60_000;

export interface CommandOpts {
  /** Extra environment (over the sandbox's `envs`). */
  envs?: Record<string, string>;
  /** Working directory; a relative one is under the user's home. Default: that home. */
  cwd?: string;
  /** The image's account to run as (default: the sandbox's default user, `user`). */
  user?: string;
  /** Its whole process group is killed after this long, ms (default 60 000; 0: no limit, which
   *  for a command run to completion is the service's longest, 3600 s). */
  timeoutMs?: number;
  /** Standard input, as text (not for background processes). */
  stdin?: string;
  /** Called with standard output as it is produced (UTF-8 decoded). */
  onStdout?: OutputCallback;
  /** Called with standard error as it is produced. */
  onStderr?: OutputCallback;
  /** Time limit of the HTTP request itself, ms (default: the command's timeout plus 30 s). */
  requestTimeoutMs?: number;
}

export interface CommandStartOpts extends CommandOpts {
  /** Start it in the background and return a `CommandHandle` at once. */
  background?: boolean;
}

function failure(r: CommandResult, cmd: string | string[]): Error | undefined {
  if (r.exitCode === 0) return undefined;
  let why: string;
  if (r.timedOut) why = "timed out and its process group was killed";
  else if (r.oomKilled) why = "had a process killed at the sandbox's memory limit";
  else if (r.exitCode === null) why = `was killed by signal ${r.signal}`;
  else why = `exited with code ${r.exitCode}`;
  const shown = typeof cmd === "string" ? cmd : cmd.join(" ");
  const message = `command ${JSON.stringify(shown.slice(0, 200))} ${why}: ${r.stderr.slice(-500)}`;
  return r.timedOut ? new CommandTimeoutError(message, r) : new CommandExitError(message, r);
}

/** Returns the result, or throws `CommandExitError` (`CommandTimeoutError` at its timeout). */
export function checkExit(r: CommandResult, cmd: string | string[]): CommandResult {
  const e = failure(r, cmd);
  if (e) throw e;
  return r;
}

/** A background process started with `commands.run(cmd, {background: true})`. */
export class CommandHandle {
  private result: CommandResult | undefined;

  constructor(
    private readonly sandbox: Sandbox,
    /** Its pid inside the sandbox. */
    readonly pid: number,
    private readonly cmd: string | string[],
    private readonly callbacks: { onStdout?: OutputCallback; onStderr?: OutputCallback } = {},
  ) {}

  /** Output and exit code, once `wait()` has returned (E2B's fields). */
  get stdout(): string {
    return this.result?.stdout ?? "";
  }
  get stderr(): string {
    return this.result?.stderr ?? "";
  }
  get exitCode(): number | null | undefined {
    return this.result?.exitCode;
  }
  get error(): string | undefined {
    return this.result?.error;
  }

  /**
   * Waits for it to exit and returns its result (its output tails); throws `CommandExitError`
   * when it failed. Without `timeoutMs` it waits as long as the process runs; with it, throws
   * `TimeoutError` when the process still runs then (and may be waited on again). The
   * `onStdout`/`onStderr` callbacks of a background command are called here, with its output
   * (the service has no live output stream of a background process).
   */
  async wait(opts: { timeoutMs?: number } = {}): Promise<CommandResult> {
    if (this.result === undefined) {
      const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
      for (;;) {
        const left = deadline === undefined ? WAIT_ROUND_MS : Math.max(1, Math.min(WAIT_ROUND_MS, deadline - Date.now()));
        const body: Body<typeof WAIT_PROCESS> = { timeout: left / 1000 };
        const d = await this.sandbox._http.json<Wire<typeof WAIT_RESULT>>({
          method: "POST",
          path: sandboxPath(this.sandbox.sandboxId, `/processes/${this.pid}/wait`),
          json: body,
          timeoutMs: left + COMMAND_MARGIN_MS,
        });
        if (!d.running && d.result) {
          this.result = parseCommandResult(d.result);
          if (this.result.stdout) await this.callbacks.onStdout?.(this.result.stdout);
          if (this.result.stderr) await this.callbacks.onStderr?.(this.result.stderr);
          break;
        }
        if (deadline !== undefined && Date.now() >= deadline) {
          throw new TimeoutError(`process ${this.pid} was still running after ${opts.timeoutMs} ms`, { code: "still_running" });
        }
      }
    }
    return checkExit(this.result, this.cmd);
  }

  /** Kills it and its process group (SIGKILL); false when it no longer exists. */
  async kill(): Promise<boolean> {
    return this.sandbox.commands.kill(this.pid);
  }
}

/** Commands in one sandbox (`sandbox.commands`). */
export class Commands {
  constructor(private readonly sandbox: Sandbox) {}

  /**
   * Runs `cmd` (a shell line, or an argv array) as the sandbox's default user (`user`) in its
   * home unless `cwd` says otherwise, and resolves to its result; rejects with
   * `CommandExitError` when it fails (`CommandTimeoutError`, also a `TimeoutError`, at its
   * timeout). With `onStdout`/`onStderr` the output streams to them as it is produced; with
   * `background: true` it resolves to a `CommandHandle` at once.
   */
  run(cmd: string | string[], opts?: CommandOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string | string[], opts: CommandOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string | string[], opts?: CommandStartOpts): Promise<CommandResult | CommandHandle>;
  async run(cmd: string | string[], opts: CommandStartOpts = {}): Promise<CommandResult | CommandHandle> {
    const s = this.sandbox;
    const user = opts.user ?? s.defaultUser;
    const timeoutMs = opts.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
    if (!(timeoutMs >= 0)) throw new InvalidArgumentError(`timeoutMs ${timeoutMs}: give 0 or more`);
    const body: Body<typeof RUN_COMMAND> = typeof cmd === "string" ? { cmd } : { argv: [...cmd] };
    if (user !== undefined) body.user = user;
    if (opts.envs && Object.keys(opts.envs).length) body.envs = { ...opts.envs };
    if (opts.cwd !== undefined) body.cwd = s._abs(opts.cwd, user);
    if (opts.background) {
      if (opts.stdin !== undefined) {
        throw new InvalidArgumentError("background processes take no stdin; write it to a file and redirect");
      }
      if (timeoutMs > 0) body.timeout = timeoutMs / 1000;
      const d = await s._http.json<Wire<typeof PROCESS_STARTED>>({
        method: "POST",
        path: sandboxPath(s.sandboxId, "/processes"),
        json: body,
      });
      const cb: { onStdout?: OutputCallback; onStderr?: OutputCallback } = {};
      if (opts.onStdout) cb.onStdout = opts.onStdout;
      if (opts.onStderr) cb.onStderr = opts.onStderr;
      return new CommandHandle(s, d.pid, cmd, cb);
    }
    const limit = timeoutMs === 0 ? LONGEST_COMMAND_MS : timeoutMs;
    body.timeout = limit / 1000;
    if (opts.stdin !== undefined) body.stdin = opts.stdin;
    const requestTimeoutMs = opts.requestTimeoutMs ?? limit + COMMAND_MARGIN_MS;
    if (!opts.onStdout && !opts.onStderr) {
      const d = await s._http.json<Wire<typeof COMMAND_RESULT>>({
        method: "POST",
        path: sandboxPath(s.sandboxId, "/commands"),
        json: body,
        timeoutMs: requestTimeoutMs,
      });
      return checkExit(parseCommandResult(d), cmd);
    }
    const cb: { stdout?: OutputCallback; stderr?: OutputCallback } = {};
    if (opts.onStdout) cb.stdout = opts.onStdout;
    if (opts.onStderr) cb.stderr = opts.onStderr;
    const dec = new StreamDecoder(cb);
    const c = { method: "POST" as const, path: sandboxPath(s.sandboxId, "/commands/stream") };
    const r = await s._http.call({ ...c, json: body, timeoutMs: requestTimeoutMs });
    try {
      for await (const chunk of r.body ?? []) await dec.feed(chunk as Uint8Array);
    } catch (e) {
      throw s._http.transportError(c, e);
    }
    return checkExit(await dec.finish(), cmd);
  }

  /** Background processes (running, and exited but not yet waited on). */
  async list(): Promise<ProcessInfo[]> {
    const d = await this.sandbox._http.json<Wire<typeof PROCESS_INFO>[]>({
      method: "GET",
      path: sandboxPath(this.sandbox.sandboxId, "/processes"),
    });
    return d.map(parseProcessInfo);
  }

  /** Sends a signal to a background process (by default to its whole process group). */
  async sendSignal(pid: number, signal: number, opts: { group?: boolean } = {}): Promise<void> {
    const body: Body<typeof SEND_SIGNAL> = { signal, group: opts.group ?? true };
    await this.sandbox._http.empty({
      method: "POST",
      path: sandboxPath(this.sandbox.sandboxId, `/processes/${Math.trunc(pid)}/signal`),
      json: body,
    });
  }

  /** Kills a background process and its group; false when it no longer exists. */
  async kill(pid: number): Promise<boolean> {
    try {
      await this.sendSignal(pid, 9);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) return false;
      throw e;
    }
  }
}
