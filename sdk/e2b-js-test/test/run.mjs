/**
 * `npm test`: starts one real branchboxd (a free loopback port, a fresh data directory, as
 * sdk/typescript/test/run.ts does), points E2B's own SDK at it with only E2B's three settings
 * (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY), runs the test files with node:test (real gVisor
 * sandboxes), then kills what is left and checks that no process of the data directory survives.
 *
 * The binary is `$BRANCHBOXD`, or `target/debug/branchboxd` of this repository; the agent and
 * shim are taken from the same directory. Data directories go under `$BRANCHBOX_TEST_DIR` when
 * set, else a temporary directory. Images come from `$BRANCHBOX_IMAGES` when set. Networked
 * sandboxes' uplinks end in a network namespace this run makes (`bbjs-<pid>`, only its loopback
 * up) and deletes afterwards, never at the host's interfaces, as the Python tests' `networked`
 * service does (needs root, as gVisor's sandboxes do).
 */

import { execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "../../..");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

/** Pids of processes whose command line names `path` (shims, runsc), other than branchboxd. */
function procsUnder(path) {
  const out = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    let cmd;
    try {
      cmd = readFileSync(`/proc/${d}/cmdline`, "latin1");
    } catch {
      continue;
    }
    if (cmd.includes(path) && !cmd.includes("branchboxd")) out.push(Number(d));
  }
  return out;
}

async function main() {
  const binary = resolve(process.env.BRANCHBOXD || join(REPO, "target/debug/branchboxd"));
  if (!existsSync(binary)) {
    console.error(`${binary} is missing: build it first (cargo build -p branchbox-service -p branchbox-agent -p branchbox-gvisor)`);
    return 1;
  }
  const base = process.env.BRANCHBOX_TEST_DIR;
  if (base) mkdirSync(base, { recursive: true });
  const work = base ?? mkdtempSync(join(tmpdir(), "bbe2bjs-"));
  const data = join(work, `e2bjs-${process.pid}`);
  const log = `${data}-branchboxd.log`;
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const netns = `bbjs-${process.pid}`;
  execFileSync("ip", ["netns", "add", netns]);
  execFileSync("ip", ["-n", netns, "link", "set", "lo", "up"]);
  const env = { ...process.env, BRANCHBOX_NET_UPLINK_NETNS: netns, BRANCHBOX_NET_STATE: `${data}-net` };
  env.BRANCHBOX_AGENT ??= join(dirname(binary), "branchbox-agent");
  env.BRANCHBOX_SHIM ??= join(dirname(binary), "branchbox-shim");
  env.RUST_LOG ??= "warn";
  const fd = openSync(log, "a");
  const svc = spawn(binary, ["--data-dir", data, "--listen", `127.0.0.1:${port}`, "--max-sandboxes", "20"], {
    env,
    stdio: ["ignore", fd, fd],
  });
  closeSync(fd);
  let exited = null;
  svc.on("exit", (code) => (exited = code ?? -1));
  let token = "";
  let rc = 1;
  try {
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
    const files = readdirSync(HERE).filter((f) => f.endsWith(".test.mjs")).sort().map((f) => join(HERE, f));
    // Only what an E2B user sets: nothing of branchbox's own configuration.
    const testEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("BRANCHBOX_") && !k.startsWith("E2B_")));
    const child = spawn(process.execPath, ["--test", "--test-reporter=spec", "--test-concurrency=2", ...files], {
      stdio: "inherit",
      env: { ...testEnv, E2B_API_URL: `${url}/e2b`, E2B_SANDBOX_URL: `${url}/e2b/envd`, E2B_API_KEY: token },
    });
    rc = await new Promise((res) => child.on("exit", (code, sig) => res(code ?? (sig ? 1 : 0))));
  } catch (e) {
    console.error(`test setup failed: ${e.message}`);
    rc = 1;
  } finally {
    if (token && exited === null) {
      try {
        const auth = { authorization: `Bearer ${token}` };
        const list = await (await fetch(`${url}/v1/sandboxes`, { headers: auth })).json();
        for (const s of list) await fetch(`${url}/v1/sandboxes/${s.id}`, { method: "DELETE", headers: auth });
      } catch (e) {
        console.error(`killing the sandboxes left failed: ${e.message}`);
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
    try {
      execFileSync("ip", ["netns", "delete", netns]);
    } catch (e) {
      console.error(`deleting the network namespace ${netns} failed: ${e.message}`);
      rc = 1;
    }
    if (rc === 0) {
      rmSync(data, { recursive: true, force: true });
      rmSync(`${data}-net`, { recursive: true, force: true });
      rmSync(log, { force: true });
      if (!base) rmSync(work, { recursive: true, force: true });
    } else {
      console.error(`branchboxd's log: ${log}`);
    }
  }
  return rc;
}

main().then((rc) => process.exit(rc));
