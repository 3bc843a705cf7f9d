/**
 * Where the service is and how to authenticate: options, then the environment, then the
 * service's own files in the data directory. A token read from those files is sent only to a
 * service that first proves it holds it (docs/security.md, "The service's proof"), exactly as
 * the Python SDK and the `branchbox` command check it.
 */

import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { AuthenticationError, InvalidArgumentError } from "./errors";

export const DEFAULT_URL = "http://127.0.0.1:7420";
/** Time limit of control requests (create, fork, snapshot), ms: the service's own is 600 s. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 600_000;
/** Time limit of the challenge request, ms. */
const CHALLENGE_TIMEOUT_MS = 5_000;

/** Connection options every entry point takes. */
export interface ConnectionOpts {
  /** The service's URL (`http://127.0.0.1:7420`); else `BRANCHBOX_URL`, else `<data>/service/url`. */
  url?: string;
  /** Alias of `url` (the Python SDK's `api_url`). */
  apiUrl?: string;
  /** E2B's name for the token. */
  apiKey?: string;
  /** The service's token; else `BRANCHBOX_TOKEN`, else `<data>/service/token` (after the
   *  service proves it holds it), else `E2B_API_KEY`. */
  token?: string;
  /** Time limit of control requests, ms (default 600 000). */
  requestTimeoutMs?: number;
}

/** Resolved connection settings. */
export interface ConnectionConfig {
  readonly url: string;
  readonly token: string | undefined;
  readonly requestTimeoutMs: number;
}

/** The data directory: `BRANCHBOX_DATA`, `/var/lib/branchbox` for root, else
 *  `~/.local/share/branchbox` (the same rule as the CLI and the Python SDK). */
export function dataDir(): string {
  const env = process.env.BRANCHBOX_DATA;
  if (env) return env;
  if (typeof process.geteuid === "function" && process.geteuid() === 0) return "/var/lib/branchbox";
  return join(homedir(), ".local/share/branchbox");
}

function readFirstLine(path: string): string | undefined {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
  const line = text.trim().split(/\r?\n/)[0]?.trim();
  return line ? line : undefined;
}

/** What a service holding `token` answers to `nonce` at address `listen`: hex HMAC-SHA256
 *  keyed with SHA-256(token) (the service keeps only that hash). */
export function proof(token: string, listen: string, nonce: string): string {
  const key = createHash("sha256").update(token, "utf8").digest();
  return createHmac("sha256", key).update(`branchbox-service-proof\n${listen}\n${nonce}`, "utf8").digest("hex");
}

function sameHex(a: string, b: string): boolean {
  const x = Buffer.from(a, "utf8");
  const y = Buffer.from(b, "utf8");
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * Throws `AuthenticationError` (code `unverified_service`) unless the process at `url` proves
 * it holds `token` (and, with `expectListen`, that it listens there): after branchboxd dies its
 * URL file stays, and whoever takes the port next must not receive the token. Nothing but the
 * nonce is sent.
 */
export async function verifyService(url: string, token: string, expectListen: string | undefined): Promise<void> {
  const nonce = randomBytes(32).toString("hex");
  let why: string | undefined;
  let answer: unknown;
  try {
    const r = await fetch(`${url}/v1/auth/challenge?nonce=${nonce}`, {
      signal: AbortSignal.timeout(CHALLENGE_TIMEOUT_MS),
      redirect: "error",
    });
    answer = await r.json();
  } catch (e) {
    why = `the challenge failed (${(e as Error).message})`;
  }
  if (why === undefined) {
    const a = answer as { listen?: unknown; proofs?: unknown } | null;
    const listen = a && typeof a === "object" ? a.listen : undefined;
    const proofs = a && typeof a === "object" ? a.proofs : undefined;
    if (typeof listen !== "string" || !Array.isArray(proofs)) {
      why = "its answer to the challenge is not the service's";
    } else if (expectListen !== undefined && listen !== expectListen) {
      why = `it proved itself for ${JSON.stringify(listen)}, not ${JSON.stringify(expectListen)}`;
    } else {
      const want = proof(token, listen, nonce);
      if (!proofs.some((p) => typeof p === "string" && sameHex(p, want))) {
        why = "its answer does not match the token";
      }
    }
  }
  if (why !== undefined) {
    throw new AuthenticationError(
      `the process answering at ${url} did not prove it is the branchbox service, so the token was not ` +
        `sent to it: ${why}; if branchboxd is not running, remove its url file`,
      { code: "unverified_service" },
    );
  }
}

/** Settings from the options, `BRANCHBOX_URL`/`BRANCHBOX_TOKEN`, the data directory, or (the
 *  token only) `E2B_API_KEY`; a token from the data directory is verified first. */
export async function resolveConfig(opts: ConnectionOpts = {}): Promise<ConnectionConfig> {
  if (opts.url !== undefined && opts.apiUrl !== undefined && opts.url !== opts.apiUrl) {
    throw new InvalidArgumentError("url and apiUrl name the same setting: give one of them");
  }
  if (opts.apiKey !== undefined && opts.token !== undefined && opts.apiKey !== opts.token) {
    throw new InvalidArgumentError("apiKey and token are the same credential: give one of them");
  }
  const service = join(dataDir(), "service");
  const namedUrl = opts.url ?? opts.apiUrl ?? (process.env.BRANCHBOX_URL || undefined);
  const fileUrl = namedUrl ? undefined : readFirstLine(join(service, "url"));
  const url = (namedUrl ?? fileUrl ?? DEFAULT_URL).replace(/\/+$/, "");
  if (!/^https?:\/\//.test(url)) {
    throw new InvalidArgumentError(`the service URL ${JSON.stringify(url)} must start with http:// or https://`);
  }
  let token = opts.apiKey ?? opts.token ?? (process.env.BRANCHBOX_TOKEN || undefined);
  if (!token) {
    token = readFirstLine(join(service, "token"));
    if (token) {
      // A URL from the service's own file is its listen address; a named one may pass a
      // proxy or tunnel that listens elsewhere, so there only the HMAC is checked.
      const expect = fileUrl ? fileUrl.replace(/\/+$/, "").replace(/^http:\/\//, "") : undefined;
      await verifyService(url, token, expect);
    }
  }
  if (!token) {
    // E2B's variable, last: a key meant for E2B's cloud is not sent to a service whose own
    // token is at hand.
    token = process.env.E2B_API_KEY || undefined;
  }
  return {
    url,
    token,
    requestTimeoutMs: opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
  };
}
