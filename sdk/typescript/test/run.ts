/**
 * `npm test`: starts one real branchboxd (a free loopback port, a fresh data directory, its
 * own token file, as sdk/python/tests/conftest.py does), runs the test files with node:test
 * against it (real gVisor sandboxes), then kills what is left and checks that no process of
 * the data directory survives.
 *
 * The binary is `$BRANCHBOXD`, or `target/debug/branchboxd` of this repository; the agent and
 * shim are taken from the same directory. Data directories go under `$BRANCHBOX_TEST_DIR` when
 * set, else a temporary directory. Images come from `$BRANCHBOX_IMAGES` when set.
 *
 * Arguments: test files to run (default: every `dist/test/*.test.js`).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";

const REPO = resolve(__dirname, "../../../..");

function freePort(): Promise<number> {
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
function procsUnder(path: string): number[] {
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(): Promise<number> {
  const binary = resolve(process.env.BRANCHBOXD || join(REPO, "target/debug/branchboxd"));
  if (!existsSync(binary)) {
    console.error(`${binary} is missing: build it first (cargo build -p branchbox-service -p branchbox-agent -p branchbox-gvisor)`);
    return 1;
  }
  const base = process.env.BRANCHBOX_TEST_DIR;
  if (base) mkdirSync(base, { recursive: true });
  const work = base ?? mkdtempSync(join(tmpdir(), "bbts-"));
  const data = join(work, `ts-${process.pid}-main`);
  const log = `${data}-branchboxd.log`;
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const env = { ...process.env };
  env.BRANCHBOX_AGENT ??= join(dirname(binary), "branchbox-agent");
  env.BRANCHBOX_SHIM ??= join(dirname(binary), "branchbox-shim");
  env.RUST_LOG ??= "warn";
  const fd = openSync(log, "a");
  const svc: ChildProcess = spawn(
    binary,
    ["--data-dir", data, "--listen", `127.0.0.1:${port}`, "--max-sandboxes", "40"],
    { env, stdio: ["ignore", fd, fd] },
  );
  closeSync(fd);
  let exited: number | null = null;
  svc.on("exit", (code) => (exited = code ?? -1));
  let token = "";
  let rc = 1;
  const stopTests: { child?: ChildProcess } = {};
  const onSignal = () => stopTests.child?.kill("SIGINT");
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    // At start the service first reconciles, which takes seconds on a loaded 2-core host.
    const deadline = Date.now() + 120_000;
    for (;;) {
      if (exited !== null) throw new Error(`branchboxd exited with ${exited}: ${readFileSync(log, "utf8").slice(-2000)}`);
      try {
        if ((await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) })).ok) break;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error("branchboxd did not answer /healthz within 120 s");
      await sleep(50);
    }
    token = readFileSync(join(data, "service/token"), "utf8").trim();
    const auth = { authorization: `Bearer ${token}` };
    // The image is built (or taken from the cache) before any test runs, so that no test's
    // time limit includes it.
    const r = await fetch(`${url}/v1/sandboxes`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: "{}",
      signal: AbortSignal.timeout(1_200_000),
    });
    if (r.status !== 201) throw new Error(`creating the first sandbox failed: ${r.status} ${await r.text()}`);
    const first = (await r.json()) as { id: string };
    await fetch(`${url}/v1/sandboxes/${first.id}`, { method: "DELETE", headers: auth });

    const args = process.argv.slice(2);
    const testDir = __dirname;
    const files = args.length
      ? args
      : readdirSync(testDir).filter((f) => f.endsWith(".test.js")).sort().map((f) => join(testDir, f));
    if (!files.length) throw new Error(`no test files in ${testDir}: run \`npm test\`, which compiles them first`);
    const child = spawn(
      process.execPath,
      ["--test", "--test-reporter=spec", `--test-concurrency=${process.env.BRANCHBOX_TEST_CONCURRENCY ?? "3"}`, ...files],
      {
        stdio: "inherit",
        env: {
          ...process.env,
          BRANCHBOX_URL: url,
          BRANCHBOX_TOKEN: token,
          BRANCHBOX_TEST_DATA: data,
          BRANCHBOX_TEST_WORK: work,
        },
      },
    );
    stopTests.child = child;
    rc = await new Promise<number>((res) => child.on("exit", (code, sig) => res(code ?? (sig ? 1 : 0))));
  } catch (e) {
    console.error(`test setup failed: ${(e as Error).message}`);
    rc = 1;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    if (token && exited === null) {
      try {
        const auth = { authorization: `Bearer ${token}` };
        const list = (await (await fetch(`${url}/v1/sandboxes`, { headers: auth })).json()) as { id: string }[];
        for (const s of list) await fetch(`${url}/v1/sandboxes/${s.id}`, { method: "DELETE", headers: auth });
      } catch (e) {
        console.error(`killing the sandboxes left failed: ${(e as Error).message}`);
        rc = 1;
      }
    }
    if (exited === null) {
      svc.kill("SIGTERM");
      const until = Date.now() + 30_000;
      while (exited === null && Date.now() < until) await sleep(50);
      if (exited === null) svc.kill("SIGKILL");
    }
    const leaked = procsUnder(data);
    for (const pid of leaked) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
    if (leaked.length) {
      console.error(`processes left behind under ${data}: ${leaked.join(", ")}`);
      rc = 1;
    }
    if (rc === 0) {
      rmSync(data, { recursive: true, force: true });
      rmSync(log, { force: true });
      if (!base) rmSync(work, { recursive: true, force: true });
    } else {
      console.error(`branchboxd's log: ${log}`);
    }
  }
  return rc;
}

main().then((rc) => process.exit(rc));
