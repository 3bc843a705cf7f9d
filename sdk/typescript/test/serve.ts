/**
 * One real branchboxd for the tests: a free loopback port, its own data directory and token
 * file, as sdk/python/tests/conftest.py starts them. `test/run.ts` starts the suite's service
 * with it; a test that needs a service of its own (test/fleet.test.ts: one with fleet peers)
 * starts one too, with the binary `run.ts` passes on in `$BRANCHBOXD`.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync, readFileSync, readdirSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";

const REPO = resolve(__dirname, "../../../..");

/** The branchboxd binary: `$BRANCHBOXD`, or `target/debug/branchboxd` of this repository. */
export function binaryPath(): string {
  return resolve(process.env.BRANCHBOXD || join(REPO, "target/debug/branchboxd"));
}

export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => res(port));
    });
  });
}

/** Pids of processes whose command line names `path` (shims, runsc), other than branchboxd. */
export function procsUnder(path: string): number[] {
  const out: number[] = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let cmd: string;
    try {
      cmd = readFileSync(`/proc/${d}/cmdline`, "latin1");
    } catch {
      continue;
    }
    if (cmd.includes(path) && !cmd.includes("branchboxd")) out.push(Number(d));
  }
  return out;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A started branchboxd. */
export class Branchboxd {
  /** Its exit code once it exited, else null. */
  exited: number | null = null;
  token = "";

  private constructor(
    readonly proc: ChildProcess,
    readonly url: string,
    readonly dataDir: string,
    readonly log: string,
  ) {
    proc.on("exit", (code) => (this.exited = code ?? -1));
  }

  /** Starts one over `dataDir` (its log beside it) and waits until it answers `/healthz`. */
  static async start(binary: string, dataDir: string, args: string[] = []): Promise<Branchboxd> {
    const port = await freePort();
    const env = { ...process.env };
    env.BRANCHBOX_AGENT ??= join(dirname(binary), "branchbox-agent");
    env.BRANCHBOX_SHIM ??= join(dirname(binary), "branchbox-shim");
    env.RUST_LOG ??= "warn";
    const log = `${dataDir}-branchboxd.log`;
    const fd = openSync(log, "a");
    const proc = spawn(binary, ["--data-dir", dataDir, "--listen", `127.0.0.1:${port}`, ...args], {
      env,
      stdio: ["ignore", fd, fd],
    });
    closeSync(fd);
    const svc = new Branchboxd(proc, `http://127.0.0.1:${port}`, dataDir, log);
    // At start the service first reconciles, which takes seconds on a loaded 2-core host.
    const deadline = Date.now() + 120_000;
    for (;;) {
      if (svc.exited !== null) {
        throw new Error(`branchboxd exited with ${svc.exited}: ${readFileSync(log, "utf8").slice(-2000)}`);
      }
      try {
        if ((await fetch(`${svc.url}/healthz`, { signal: AbortSignal.timeout(2000) })).ok) break;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) {
        svc.proc.kill("SIGKILL");
        throw new Error("branchboxd did not answer /healthz within 120 s");
      }
      await sleep(50);
    }
    svc.token = readFileSync(join(dataDir, "service/token"), "utf8").trim();
    return svc;
  }

  /** Kills the sandboxes it lists (`local=true`: its own, whatever peers it has), stops it, and
   *  kills what its data directory left running. Returns what went wrong, empty when nothing. */
  async stop(): Promise<string[]> {
    const problems: string[] = [];
    if (this.token && this.exited === null) {
      try {
        const auth = { authorization: `Bearer ${this.token}` };
        const r = await fetch(`${this.url}/v1/sandboxes?local=true`, { headers: auth });
        const list = (await r.json()) as { id: string }[];
        for (const s of list) await fetch(`${this.url}/v1/sandboxes/${s.id}`, { method: "DELETE", headers: auth });
      } catch (e) {
        problems.push(`killing the sandboxes left failed: ${(e as Error).message}`);
      }
    }
    if (this.exited === null) {
      this.proc.kill("SIGTERM");
      const until = Date.now() + 30_000;
      while (this.exited === null && Date.now() < until) await sleep(50);
      if (this.exited === null) this.proc.kill("SIGKILL");
    }
    const leaked = procsUnder(this.dataDir);
    for (const pid of leaked) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
    if (leaked.length) problems.push(`processes left behind under ${this.dataDir}: ${leaked.join(", ")}`);
    return problems;
  }
}
