/** The HTTP transport: Node's built-in `fetch`, the service's errors turned into typed ones. */

import type { ConnectionConfig } from "./config";
import { BranchboxError, ServiceUnavailableError, TimeoutError, fromResponse } from "./errors";
import type { Method } from "./wire";

export const USER_AGENT = "branchbox-typescript/0.1.0";

/** Extra time a command's HTTP request waits beyond the command's own timeout, ms. */
export const COMMAND_MARGIN_MS = 30_000;

/** A request body fetch takes. */
export type RequestBody = NonNullable<RequestInit["body"]>;

/** One request. */
export interface Call {
  method: Method;
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  /** A JSON body. */
  json?: unknown;
  /** A raw body (file uploads). */
  body?: RequestBody;
  headers?: Record<string, string>;
  /** Time limit, ms (default: the connection's request timeout). */
  timeoutMs?: number;
}

/** Methods safe to send again when a pooled connection turns out to be closed. */
const IDEMPOTENT = new Set<Method>(["GET", "PUT", "DELETE"]);

/** Percent-encodes one path segment. */
export function seg(s: string | number): string {
  return encodeURIComponent(String(s));
}

/** `/v1/sandboxes/{id}` and what follows. */
export function sandboxPath(id: string, rest = ""): string {
  return `/v1/sandboxes/${seg(id)}${rest}`;
}

/** Whether a fetch failure is a kept-alive connection the server had closed. */
function isClosedSocket(e: unknown): boolean {
  const cause = (e as { cause?: { code?: string } } | undefined)?.cause;
  return ["UND_ERR_SOCKET", "ECONNRESET", "EPIPE", "UND_ERR_CLOSED"].includes(cause?.code ?? "");
}

function describe(e: unknown): string {
  const err = e as Error & { cause?: Error & { code?: string } };
  const cause = err.cause ? `: ${err.cause.code ?? ""} ${err.cause.message ?? ""}`.trimEnd() : "";
  return `${err.message}${cause}`;
}

/** Throws the typed error of a failed answer (reading its `{"error": {code, message}}`). */
export async function raiseFor(r: Response): Promise<void> {
  if (r.status < 400) return;
  let code: string | undefined;
  let message = r.statusText || `HTTP ${r.status}`;
  try {
    const body = (await r.json()) as { error?: { code?: unknown; message?: unknown } };
    if (typeof body?.error?.code === "string") code = body.error.code;
    if (typeof body?.error?.message === "string") message = body.error.message;
  } catch {
    // Not the service's error body (a proxy's page): the status says enough.
  }
  throw fromResponse(r.status, code, message);
}

/** The connection to one service, shared by a sandbox and the children it forks. */
export class Http {
  constructor(readonly cfg: ConnectionConfig) {}

  headers(): Record<string, string> {
    const h: Record<string, string> = { "user-agent": USER_AGENT };
    if (this.cfg.token) h.authorization = `Bearer ${this.cfg.token}`;
    return h;
  }

  url(c: Pick<Call, "path" | "query">): string {
    let u = this.cfg.url + c.path;
    if (c.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(c.query)) if (v !== undefined) q.set(k, String(v));
      const s = q.toString();
      if (s) u += `?${s}`;
    }
    return u;
  }

  private async send(c: Call): Promise<Response> {
    const headers = { ...this.headers(), ...c.headers };
    let body: RequestBody | undefined = c.body;
    if (c.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(c.json);
    }
    const init: RequestInit & { duplex?: "half" } = {
      method: c.method,
      headers,
      redirect: "error",
      signal: AbortSignal.timeout(c.timeoutMs ?? this.cfg.requestTimeoutMs),
    };
    if (body !== undefined) init.body = body;
    if (body instanceof ReadableStream) init.duplex = "half";
    return fetch(this.url(c), init);
  }

  /** Sends a request and returns its answer, or throws the typed error. */
  async call(c: Call): Promise<Response> {
    let r: Response;
    try {
      try {
        r = await this.send(c);
      } catch (e) {
        // A pooled keep-alive connection the service closed as it was reused: an idempotent
        // request (without a one-shot stream body) is sent once more on a fresh one.
        if (!isClosedSocket(e) || !IDEMPOTENT.has(c.method) || c.body instanceof ReadableStream) throw e;
        r = await this.send(c);
      }
    } catch (e) {
      throw this.transportError(c, e);
    }
    await raiseFor(r);
    return r;
  }

  /** `call`, then the answer's JSON. */
  async json<T>(c: Call): Promise<T> {
    const r = await this.call(c);
    try {
      return (await r.json()) as T;
    } catch (e) {
      throw this.transportError(c, e);
    }
  }

  /** `call` for a route that answers no body (204). */
  async empty(c: Call): Promise<void> {
    const r = await this.call(c);
    await r.body?.cancel();
  }

  /** The SDK's error for a request that failed below HTTP. */
  transportError(c: Pick<Call, "method" | "path">, e: unknown): BranchboxError {
    if (e instanceof BranchboxError) return e;
    const name = (e as Error)?.name;
    if (name === "TimeoutError" || name === "AbortError") {
      return new TimeoutError(`${c.method} ${c.path} did not answer in time: ${describe(e)}`, { cause: e });
    }
    return new ServiceUnavailableError(
      `cannot reach the branchbox service at ${this.cfg.url} (${c.method} ${c.path}): ${describe(e)}`,
      { cause: e },
    );
  }
}
