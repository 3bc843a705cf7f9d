/**
 * `npm test`: starts one real branchboxd (a free loopback port, a fresh data directory, its
 * own token file, as sdk/python/tests/conftest.py does), runs the test files with node:test
 * against it (real gVisor sandboxes), then kills what is left and checks that no process of
 * the data directory survives.
 *
 * The binary is `$BRANCHBOXD`, or `target/debug/branchboxd` of this repository (passed on to
 * the tests in `$BRANCHBOXD`); the agent and shim are taken from the same directory
 * (test/serve.ts starts it). Data directories go under `$BRANCHBOX_TEST_DIR` when
 * set, else a temporary directory. Images come from `$BRANCHBOX_IMAGES` when set.
 *
 * Arguments: test files to run (default: every `dist/test/*.test.js`).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Branchboxd, binaryPath } from "./serve";

async function main(): Promise<number> {
  const binary = binaryPath();
  if (!existsSync(binary)) {
    console.error(`${binary} is missing: build it first (cargo build -p branchbox-service -p branchbox-agent -p branchbox-gvisor)`);
    return 1;
  }
  const base = process.env.BRANCHBOX_TEST_DIR;
  if (base) mkdirSync(base, { recursive: true });
  const work = base ?? mkdtempSync(join(tmpdir(), "bbts-"));
  const data = join(work, `ts-${process.pid}-main`);
  let svc: Branchboxd | undefined;
  let rc = 1;
  const stopTests: { child?: ChildProcess } = {};
  const onSignal = () => stopTests.child?.kill("SIGINT");
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    svc = await Branchboxd.start(binary, data, ["--max-sandboxes", "40"]);
    const { url, token } = svc;
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
          BRANCHBOXD: binary,
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
    const problems = svc ? await svc.stop() : [];
    for (const p of problems) console.error(p);
    if (problems.length) rc = 1;
    if (rc === 0) {
      rmSync(data, { recursive: true, force: true });
      rmSync(`${data}-branchboxd.log`, { force: true });
      if (!base) rmSync(work, { recursive: true, force: true });
    } else {
      console.error(`branchboxd's log: ${data}-branchboxd.log`);
    }
  }
  return rc;
}

main().then((rc) => process.exit(rc));
