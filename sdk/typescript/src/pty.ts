/**
 * Terminals: `GET /v1/sandboxes/{id}/pty`, a WebSocket. Binary messages carry input (to the
 * service) and terminal output (from it); text messages carry JSON: `{"type": "resize", cols,
 * rows}` to the service, `{"type": "exit", code, signal}` or `{"type": "error", code,
 * message}` from it, each followed by a normal close.
 */

import WebSocket from "ws";
import { BranchboxError, InvalidArgumentError, ServiceUnavailableError, fromCode, fromResponse } from "./errors";
import { USER_AGENT, sandboxPath } from "./http";
import type { Sandbox } from "./sandbox";

export interface PtySize {
  cols: number;
  rows: number;
}

export interface PtyCreateOpts extends Partial<PtySize> {
  /** A shell line to run in the terminal (default: a login shell). */
  cmd?: string;
  /** The image's account to run as (default: the sandbox's default user). */
  user?: string;
  /** Working directory; a relative one is under the user's home. */
  cwd?: string;
  /** Called with terminal output as it arrives. */
  onData?: (data: Uint8Array) => void;
  /** Time limit of the connection's opening handshake, ms (default 60 000). */
  requestTimeoutMs?: number;
}

/** How a terminal's process ended. */
export interface PtyResult {
  /** Exit code; `null` when it was killed by a signal. */
  exitCode: number | null;
  signal: number | null;
}

/** How long `kill()` waits for the service to answer its close before cutting the connection. */
const KILL_GRACE_MS = 5_000;

function checkSize(what: string, n: number | undefined, dflt: number): number {
  const v = n ?? dflt;
  if (!Number.isInteger(v) || v < 1 || v > 1000) throw new InvalidArgumentError(`${what} ${n}: give 1 to 1000`);
  return v;
}

/** A running terminal (`sandbox.pty.create(...)`). */
export class PtyHandle {
  private outcome: { result: PtyResult } | { error: BranchboxError } | undefined;
  private readonly done: Promise<PtyResult>;

  /** @internal */
  constructor(private readonly ws: WebSocket, onData: ((data: Uint8Array) => void) | undefined) {
    this.done = new Promise<PtyResult>((resolve, reject) => {
      ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
        const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as ArrayBuffer);
        if (isBinary) {
          onData?.(new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength));
          return;
        }
        let m: { type?: string; code?: unknown; signal?: unknown; message?: unknown };
        try {
          m = JSON.parse(buf.toString("utf8"));
        } catch {
          return;
        }
        if (m.type === "exit" && this.outcome === undefined) {
          this.outcome = {
            result: {
              exitCode: typeof m.code === "number" ? m.code : null,
              signal: typeof m.signal === "number" ? m.signal : null,
            },
          };
        } else if (m.type === "error" && this.outcome === undefined) {
          const code = typeof m.code === "string" ? m.code : undefined;
          this.outcome = { error: fromCode(code, typeof m.message === "string" ? m.message : "the terminal failed") };
        }
      });
      ws.on("error", (e: Error) => {
        if (this.outcome === undefined) {
          this.outcome = { error: new ServiceUnavailableError(`the terminal's connection failed: ${e.message}`, { cause: e }) };
        }
      });
      ws.on("close", (code: number) => {
        const o = this.outcome;
        if (o && "result" in o) resolve(o.result);
        else if (o) reject(o.error);
        else reject(new BranchboxError(`the terminal's connection closed (${code}) before its exit status`, { code: "stream_cut" }));
      });
    });
    // A handle nobody waits on must not end the process with an unhandled rejection.
    this.done.catch(() => undefined);
  }

  /** Sends input: bytes, or text (as UTF-8). */
  async sendInput(data: Uint8Array | string): Promise<void> {
    const buf = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    await this.sendRaw(buf, true);
  }

  /** Changes the terminal's size. */
  async resize(size: PtySize): Promise<void> {
    const msg = { type: "resize", cols: checkSize("cols", size.cols, 80), rows: checkSize("rows", size.rows, 24) };
    await this.sendRaw(JSON.stringify(msg), false);
  }

  private sendRaw(data: Buffer | string, binary: boolean): Promise<void> {
    if (this.ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new BranchboxError("the terminal has ended", { code: "pty_closed" }));
    }
    return new Promise((resolve, reject) =>
      this.ws.send(data, { binary }, (e) => (e ? reject(new ServiceUnavailableError(`sending to the terminal failed: ${e.message}`, { cause: e })) : resolve())),
    );
  }

  /** Ends the terminal: closes its connection, and the service ends its process. False when it
   *  had already ended. */
  async kill(): Promise<boolean> {
    const running = this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING;
    if (running) {
      if (this.outcome === undefined) this.outcome = { result: { exitCode: null, signal: 9 } };
      this.ws.close(1000, "killed");
      // A service that does not answer the close within a few seconds is cut off.
      const cut = setTimeout(() => this.ws.terminate(), KILL_GRACE_MS);
      cut.unref();
      await this.done.catch(() => undefined);
      clearTimeout(cut);
    }
    await this.done.catch(() => undefined);
    return running;
  }

  /** Waits for its process to end: its exit code (or signal). Rejects with the service's
   *  typed error when the terminal failed. */
  wait(): Promise<PtyResult> {
    return this.done;
  }
}

/** Terminals in one sandbox (`sandbox.pty`). */
export class Pty {
  constructor(private readonly sandbox: Sandbox) {}

  /** Starts a terminal (80x24 and a login shell unless told otherwise) and resolves once it is
   *  connected; rejects with the service's typed error (e.g. `NotFoundError`) when refused. */
  async create(opts: PtyCreateOpts = {}): Promise<PtyHandle> {
    const s = this.sandbox;
    const query: Record<string, string> = {
      cols: String(checkSize("cols", opts.cols, 80)),
      rows: String(checkSize("rows", opts.rows, 24)),
    };
    if (opts.cmd !== undefined) query.cmd = opts.cmd;
    const user = opts.user ?? s.defaultUser;
    if (user !== undefined) query.user = user;
    if (opts.cwd !== undefined) query.cwd = s._abs(opts.cwd, user);
    const url = s._http.url({ path: sandboxPath(s.sandboxId, "/pty"), query }).replace(/^http/, "ws");
    const headers: Record<string, string> = { "user-agent": USER_AGENT };
    if (s._http.cfg.token) headers.authorization = `Bearer ${s._http.cfg.token}`;
    const ws = new WebSocket(url, {
      headers,
      handshakeTimeout: opts.requestTimeoutMs ?? 60_000,
      followRedirects: false,
      perMessageDeflate: false,
    });
    const handle = new PtyHandle(ws, opts.onData);
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          let code: string | undefined;
          let message = `the service answered ${res.statusCode} to the terminal's request`;
          try {
            const b = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { error?: { code?: string; message?: string } };
            code = b.error?.code;
            message = b.error?.message ?? message;
          } catch {
            // Not the service's error body: the status says enough.
          }
          reject(fromResponse(res.statusCode ?? 502, code, message));
          ws.terminate();
        });
      });
      ws.once("error", (e: Error) =>
        reject(new ServiceUnavailableError(`cannot open a terminal at ${s._http.cfg.url}: ${e.message}`, { cause: e })),
      );
    });
    return handle;
  }
}
