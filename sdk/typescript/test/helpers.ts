/** What the test files share: the service `run.ts` started, and sandboxes made for a test. */

import { Http, type Call } from "../src/http";
import { ROUTES, Sandbox, type SandboxOpts } from "../src/index";

export interface Service {
  url: string;
  token: string;
  /** Its data directory (with `service/url` and `service/token`). */
  dataDir: string;
  /** Where tests may make directories of their own. */
  work: string;
}

let started: Service | undefined;

/** The service `npm test` (test/run.ts) started (read from the environment on the first call,
 *  so tests may change the environment afterwards). */
export function service(): Service {
  if (started) return started;
  const { BRANCHBOX_URL: url, BRANCHBOX_TOKEN: token, BRANCHBOX_TEST_DATA: dataDir, BRANCHBOX_TEST_WORK: work } = process.env;
  if (!url || !token || !dataDir || !work) {
    throw new Error("run the tests with `npm test` (test/run.ts starts branchboxd for them)");
  }
  started = { url, token, dataDir, work };
  return started;
}

/** A sandbox for one test file, killed by `after`. Ten minutes unless told otherwise. */
export async function sandbox(opts: SandboxOpts = {}): Promise<Sandbox> {
  return Sandbox.create({ timeoutMs: 600_000, ...opts });
}

/** Kills sandboxes, ignoring any already gone. */
export async function killAll(...boxes: (Sandbox | undefined | unknown)[]): Promise<void> {
  await Promise.all(boxes.map((b) => (b instanceof Sandbox ? b.kill() : undefined)));
}

/**
 * Every request the SDK sends in a test must be to a route of its table (`ROUTES`, which
 * test/openapi.test.ts checks against the live document): a call to a route the table lacks
 * fails the test that made it, so the table cannot silently fall behind the code.
 */
const original = Http.prototype.call;
const templates = ROUTES.map((r) => ({
  method: r.method,
  path: r.path,
  re: new RegExp(`^${r.path.replace(/\{[^}]+\}/g, "[^/]+")}$`),
}));
Http.prototype.call = function (this: Http, c: Call): Promise<Response> {
  if (!templates.some((t) => t.method === c.method && t.re.test(c.path))) {
    return Promise.reject(new Error(`${c.method} ${c.path} is not in the SDK's table of routes (src/wire.ts ROUTES)`));
  }
  return original.call(this, c);
};
