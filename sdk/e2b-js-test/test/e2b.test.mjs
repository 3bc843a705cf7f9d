// E2B's own JavaScript SDK (npm `e2b`, pinned in package.json) against branchboxd, configured
// only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (set by run.mjs). Real gVisor sandboxes.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { CommandExitError, FilesystemEventType, Sandbox, TimeoutError } from "e2b";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let sbx;

before(async () => {
  sbx = await Sandbox.create({ timeoutMs: 600_000 });
});

after(async () => {
  await sbx?.kill();
});

test("commands: foreground, streaming, exit codes and timeouts", async () => {
  const r = await sbx.commands.run("echo out; echo err >&2; echo $FOO", { envs: { FOO: "bar" } });
  assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, "out\nbar\n", "err\n"]);
  assert.equal((await sbx.commands.run("whoami; pwd")).stdout, "user\n/home/user\n");

  const seen = [];
  await sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", { onStdout: (d) => seen.push(d) });
  assert.equal(seen.join(""), "line1\nline2\nline3\n");

  await assert.rejects(sbx.commands.run("echo nope >&2; exit 3"), (e) => e instanceof CommandExitError && e.exitCode === 3 && e.stderr === "nope\n");
  await assert.rejects(sbx.commands.run("sleep 30", { timeoutMs: 2000 }), TimeoutError);
});

test("commands: background, stdin, connect, list and kill", async () => {
  const h = await sbx.commands.run("sleep 0.5; echo done", { background: true });
  assert.ok(h.pid > 1);
  assert.equal((await h.wait()).stdout, "done\n");

  const cat = await sbx.commands.run("cat", { background: true, stdin: true });
  await sbx.commands.sendStdin(cat.pid, "one\n");
  await sbx.commands.sendStdin(cat.pid, "two\n");
  await sbx.commands.closeStdin(cat.pid);
  assert.equal((await cat.wait()).stdout, "one\ntwo\n");

  const long = await sbx.commands.run("sleep 60", { background: true, timeoutMs: 0 });
  assert.ok((await sbx.commands.list()).some((p) => p.pid === long.pid));
  const again = await sbx.commands.connect(long.pid);
  assert.equal(again.pid, long.pid);
  assert.equal(await sbx.commands.kill(long.pid), true);
  await assert.rejects(again.wait(), CommandExitError);
  assert.equal(await sbx.commands.kill(long.pid), false);

  const other = await sbx.commands.run("sleep 60", { background: true });
  assert.equal(await other.kill(), true);
});

test("files: write, read, list and watch", async () => {
  await sbx.files.makeDir("/home/user/w");
  const events = [];
  const watch = await sbx.files.watchDir("/home/user/w", (e) => events.push(e), { recursive: true });
  const info = await sbx.files.write("w/plan.txt", "step 1\n");
  assert.equal(info.path, "/home/user/w/plan.txt");
  assert.equal(await sbx.files.read("w/plan.txt"), "step 1\n");
  const names = (await sbx.files.list("/home/user/w")).map((e) => e.name);
  assert.deepEqual(names, ["plan.txt"]);
  for (let i = 0; i < 100 && !events.some((e) => e.name === "plan.txt" && e.type === FilesystemEventType.WRITE); i++) await sleep(100);
  await watch.stop();
  assert.ok(events.some((e) => e.name === "plan.txt" && e.type === FilesystemEventType.CREATE), JSON.stringify(events));
  assert.ok(events.some((e) => e.name === "plan.txt" && e.type === FilesystemEventType.WRITE), JSON.stringify(events));
});

test("lifecycle: setTimeout, getInfo and kill", async () => {
  const s = await Sandbox.create({ timeoutMs: 300_000, metadata: { suite: "e2b-js" } });
  try {
    const before = (await s.getInfo()).endAt;
    await s.setTimeout(900_000);
    assert.ok((await s.getInfo()).endAt > before);
    assert.equal(await s.isRunning(), true);
  } finally {
    await s.kill();
  }
  assert.equal(await s.isRunning(), false);
});
