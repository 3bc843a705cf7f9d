// E2B's own JavaScript SDK (npm `e2b`, pinned) on the routes and behaviours issue 28 added or
// fixed in branchboxd's E2B wire API: connect that only extends, setTimeout(0), kill and get of
// unknown ids, remove of a missing path, sudo, snapshots, fork, network rules and metrics. The
// JavaScript side of sdk/python/tests/test_e2b_{fixes,sudo,snapshots,network,metrics}.py, as far
// as the JS SDK exposes each. Configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
// (run.mjs); real gVisor sandboxes. No traffic leaves any sandbox: the network test reads and
// changes rules only (the Python test shows them enforced).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { ALL_TRAFFIC, CommandExitError, NotFoundError, Sandbox, SandboxError, SandboxNotFoundError } from "e2b";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const MIB = 1 << 20;

/** Polls `cond` until it answers something truthy; fails after `limitMs`. */
async function waitUntil(cond, what, limitMs = 60_000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`${what} did not happen within ${limitMs / 1000} s`);
    await sleep(200);
  }
}

/** Kills each sandbox given (instances or errors, as fork answers), whatever happens to the others. */
async function killAll(list) {
  await Promise.all(list.filter((s) => s instanceof Sandbox).map((s) => s.kill().catch(() => {})));
}

// One sandbox for the checks that leave it as it was (connect, remove, sudo, metrics).
let sbx;

before(async () => {
  sbx = await Sandbox.create({ timeoutMs: 3_600_000 });
});

after(async () => {
  await sbx?.kill();
});

test("connect extends a sandbox's end and never shortens it", async () => {
  const end = (await sbx.getInfo()).endAt.getTime();
  // The SDKs send their default 300 s on a connect; a sandbox created for an hour keeps its hour.
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 });
  assert.equal((await again.commands.run("echo hi")).stdout, "hi\n");
  assert.ok((await sbx.getInfo()).endAt.getTime() >= end, "connect cut the sandbox's time short");
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 7_200_000 });
  assert.ok((await sbx.getInfo()).endAt.getTime() >= end + 3000_000, "a longer timeout did not extend it");
});

test("setTimeout(0) is accepted and ends the sandbox now", async () => {
  const s = await Sandbox.create({ timeoutMs: 600_000 });
  try {
    await s.setTimeout(0);
    await waitUntil(async () => !(await s.isRunning()), "the sandbox to end at its zero timeout");
    await assert.rejects(Sandbox.getInfo(s.sandboxId), SandboxNotFoundError);
  } finally {
    await Sandbox.kill(s.sandboxId);
  }
});

test("unknown and foreign-shaped ids are not found: kill answers false", async () => {
  for (const bad of ["x", "not-a-sandbox", "sbx-", "sbx-0000000000000000"]) {
    assert.equal(await Sandbox.kill(bad), false, bad);
    await assert.rejects(Sandbox.getInfo(bad), SandboxNotFoundError, bad);
    await assert.rejects(Sandbox.setTimeout(bad, 60_000), SandboxNotFoundError, bad);
    await assert.rejects(Sandbox.connect(bad), SandboxNotFoundError, bad);
  }
});

test("files.remove of a path that is not there succeeds, as envd's does", async () => {
  await sbx.files.remove("/home/user/never-was-here.txt");
  await sbx.files.remove("never/was/here");
  await sbx.files.write("gone.txt", "x");
  await sbx.files.remove("gone.txt");
  assert.equal(await sbx.files.exists("gone.txt"), false);
});

test("sudo as user runs as root, by name and by /usr/bin/sudo; others are refused", async () => {
  const run = (cmd, opts) => sbx.commands.run(cmd, opts);
  assert.equal((await run("sudo -n true")).exitCode, 0);
  assert.equal((await run("sudo whoami")).stdout, "root\n");
  assert.equal((await run("/usr/bin/sudo -n true")).exitCode, 0);
  assert.equal((await run("sudo sh -c 'echo $SUDO_USER $(id -u)'")).stdout, "user 0\n");
  assert.equal((await run("echo fed | sudo cat")).stdout, "fed\n");
  await assert.rejects(
    run("sudo -n true", { user: "nobody", cwd: "/tmp" }),
    (e) => e instanceof CommandExitError && e.stderr.includes("may not run commands as root"),
  );
});

test("metrics answer one point with the sandbox's limits and sane use", async () => {
  const info = await sbx.getInfo();
  const points = await sbx.getMetrics();
  assert.equal(points.length, 1, JSON.stringify(points));
  const [m] = points;
  assert.equal(m.cpuCount, info.cpuCount);
  assert.equal(m.memTotal, info.memoryMB * MIB);
  assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m));
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal && m.memCache >= 0, JSON.stringify(m));
  assert.deepEqual([m.diskUsed, m.diskTotal], [0, 0]);
  assert.ok(Math.abs(Date.now() - m.timestamp.getTime()) < 60_000, JSON.stringify(m));
  // An interval that ended an hour ago holds no point; one reaching now holds it.
  const hourAgo = new Date(Date.now() - 3_600_000);
  assert.deepEqual(await sbx.getMetrics({ end: hourAgo }), []);
  assert.equal((await Sandbox.getMetrics(sbx.sandboxId, { start: hourAgo })).length, 1);
  await assert.rejects(Sandbox.getMetrics("sbx-0000000000000000"), SandboxNotFoundError);
});

/**
 * Holds a value read from /tmp/secret in its memory only (the file is removed) and writes it to
 * /tmp/dumped on SIGUSR1: a copy that answers with the value has the process's memory.
 */
const HOLDER = `import os, signal, time
value = open("/tmp/secret").read()
os.remove("/tmp/secret")
signal.signal(signal.SIGUSR1, lambda *_: open("/tmp/dumped", "w").write(value))
open("/tmp/holding", "w").close()
while True:
    time.sleep(1)
`;

/** Starts the holder in `s` holding `value`; resolves once it holds it. */
async function startHolder(s, value) {
  await s.files.write("/tmp/holder.py", HOLDER);
  await s.files.write("/tmp/secret", value);
  await s.commands.run("python3 /tmp/holder.py", { background: true, timeoutMs: 0 });
  await waitUntil(() => s.files.exists("/tmp/holding"), "the holder to start", 30_000);
}

/** The value the holder running in `s` holds, asked by signal. */
async function held(s) {
  await s.commands.run("pkill -USR1 -f /tmp/holder.py");
  await waitUntil(() => s.files.exists("/tmp/dumped"), "the holder to answer", 30_000);
  return s.files.read("/tmp/dumped");
}

test("snapshots: create, list, restore files and a running process, delete", async () => {
  const src = await Sandbox.create({ timeoutMs: 300_000 });
  const copies = [];
  try {
    await src.files.write("/home/user/kept.txt", "before the snapshot");
    await startHolder(src, "held in memory");
    const name = `e2b-js-snap-${randomUUID().slice(0, 8)}`;
    const snap = await src.createSnapshot({ name });
    assert.match(snap.snapshotId, /^snap-/);
    assert.deepEqual(snap.names, [name]);
    await src.files.write("/home/user/kept.txt", "after the snapshot");

    const ids = async (opts) => (await Sandbox.listSnapshots(opts).nextItems()).map((s) => s.snapshotId);
    assert.deepEqual(await ids({ sandboxId: src.sandboxId }), [snap.snapshotId]);
    assert.deepEqual((await src.listSnapshots().nextItems()).map((s) => s.snapshotId), [snap.snapshotId]);
    assert.deepEqual(await ids({ name }), [snap.snapshotId]);
    assert.deepEqual(await ids({ name: `${name}-none` }), []);
    assert.ok((await ids({})).includes(snap.snapshotId));

    // Restored by id and by name: the files and the processes of the moment it was taken.
    for (const ref of [snap.snapshotId, name]) {
      const copy = await Sandbox.create(ref, { timeoutMs: 120_000 });
      copies.push(copy);
      assert.notEqual(copy.sandboxId, src.sandboxId);
      assert.equal(await copy.files.read("/home/user/kept.txt"), "before the snapshot");
      assert.equal(await held(copy), "held in memory");
      await copy.files.write("/home/user/kept.txt", "changed in the copy");
      assert.equal(await src.files.read("/home/user/kept.txt"), "after the snapshot");
    }
    assert.equal(await src.files.exists("/tmp/dumped"), false, "the copies' signal reached the source");

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false);
    assert.deepEqual(await ids({ sandboxId: src.sandboxId }), []);
    await assert.rejects(Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 }), SandboxError);
  } finally {
    await killAll([src, ...copies]);
  }
});

test("fork of three: each child answers and goes on from the source's file and process", async () => {
  const src = await Sandbox.create({ timeoutMs: 300_000 });
  let forks = [];
  try {
    await src.files.write("/home/user/state.txt", "before the fork");
    await startHolder(src, "the source's memory");
    forks = await src.fork({ count: 3, timeoutMs: 90_000 });
    assert.equal(forks.length, 3);
    for (const f of forks) assert.ok(f instanceof Sandbox, String(f));
    const ids = new Set(forks.map((f) => f.sandboxId));
    assert.equal(ids.size, 3);
    assert.ok(!ids.has(src.sandboxId));
    assert.equal(await src.isRunning(), true);
    const srcEnd = (await src.getInfo()).endAt.getTime();
    for (const [i, f] of forks.entries()) {
      assert.equal(await f.isRunning(), true);
      assert.equal((await f.commands.run("echo hi")).stdout, "hi\n");
      assert.equal(await f.files.read("/home/user/state.txt"), "before the fork");
      assert.equal(await held(f), "the source's memory");
      await f.files.write("/home/user/state.txt", `fork ${i}`);
      // timeoutMs is each child's own: 90 s, before the source's 300 s.
      assert.ok((await f.getInfo()).endAt.getTime() <= srcEnd);
    }
    const states = await Promise.all(forks.map((f) => f.files.read("/home/user/state.txt")));
    assert.deepEqual(states, ["fork 0", "fork 1", "fork 2"]);
    assert.equal(await src.files.read("/home/user/state.txt"), "before the fork");

    const byId = await Sandbox.fork(src.sandboxId);
    forks.push(...byId);
    assert.equal(byId.length, 1);
    assert.equal((await byId[0].commands.run("echo one")).stdout, "one\n");
  } finally {
    await killAll([src, ...forks]);
  }
  await assert.rejects(src.fork(), NotFoundError);
});

/** The private ranges branchbox's internet mode refuses: how getInfo shows that mode. */
const PRIVATE = [
  "10.0.0.0/8",
  "172.16.0.0/12",
  "192.168.0.0/16",
  "100.64.0.0/10",
  "169.254.0.0/16",
  "127.0.0.0/8",
  "0.0.0.0/8",
  "192.0.0.0/24",
  "198.18.0.0/15",
  "224.0.0.0/3",
];

/** The network rules and allowInternetAccess getInfo shows, without the fields left unset. */
async function shown(s) {
  const { network, allowInternetAccess } = await s.getInfo();
  const set = network && Object.fromEntries(Object.entries(network).filter(([, v]) => v !== undefined));
  return [set, allowInternetAccess];
}

test("network: getInfo shows the rules a sandbox was created with, updateNetwork changes them", async () => {
  const [a, b] = ["203.0.113.10", "198.51.100.20"];
  const s = await Sandbox.create({ timeoutMs: 300_000, network: { allowOut: [a], denyOut: [ALL_TRAFFIC] } });
  try {
    const listed = { denyOut: [ALL_TRAFFIC], allowPublicTraffic: false };
    assert.deepEqual(await shown(s), [{ allowOut: [`${a}/32`], ...listed }, false]);

    await s.updateNetwork({ allowOut: [`${b}/32`], denyOut: [ALL_TRAFFIC] });
    assert.deepEqual(await shown(s), [{ allowOut: [`${b}/32`], ...listed }, false]);

    // What an update leaves out is cleared: no rules is the internet, shown as the ranges it refuses.
    await s.updateNetwork({});
    const internet = [{ denyOut: PRIVATE, allowPublicTraffic: false }, true];
    assert.deepEqual(await shown(s), internet);

    await Sandbox.updateNetwork(s.sandboxId, { allowInternetAccess: false });
    const denyAll = [{ denyOut: [ALL_TRAFFIC], allowPublicTraffic: false }, false];
    assert.deepEqual(await shown(s), denyAll);

    // What getInfo shows, handed back, sets the same rules.
    await s.updateNetwork({ allowOut: ["pypi.org", b], denyOut: [ALL_TRAFFIC] });
    const [rules] = await shown(s);
    assert.deepEqual(rules.allowOut, [`${b}/32`, "pypi.org"]);
    await s.updateNetwork({ allowInternetAccess: false });
    await s.updateNetwork(rules);
    assert.deepEqual((await shown(s))[0], rules);
    await s.updateNetwork({ allowInternetAccess: false });

    // A rule branchbox cannot honour is refused by name and changes nothing.
    await assert.rejects(s.updateNetwork({ denyOut: ["198.51.100.0/24"] }), /denyOut 198\.51\.100\.0\/24/);
    assert.deepEqual(await shown(s), denyAll);
  } finally {
    await s.kill();
  }
  await assert.rejects(Sandbox.updateNetwork(s.sandboxId, {}), SandboxNotFoundError);
});

test("network: allowInternetAccess false beside allowOut is the list; refused options name themselves", async () => {
  const s = await Sandbox.create({ timeoutMs: 120_000, allowInternetAccess: false, network: { allowOut: ["198.51.100.20"] } });
  try {
    const rules = { allowOut: ["198.51.100.20/32"], denyOut: [ALL_TRAFFIC], allowPublicTraffic: false };
    assert.deepEqual(await shown(s), [rules, false]);
  } finally {
    await s.kill();
  }
  for (const [network, named] of [
    [{ allowPublicTraffic: true }, /allowPublicTraffic/],
    [{ denyOut: ["198.51.100.0/24"] }, /denyOut 198\.51\.100\.0\/24/],
    [{ allowOut: ["10.0.0.0/8"] }, /allowOut 10\.0\.0\.0\/8/],
  ]) {
    await assert.rejects(Sandbox.create({ timeoutMs: 60_000, network }), named);
  }
  // The shared sandbox was made without a network: no rules shown, none can be given.
  assert.deepEqual(await shown(sbx), [undefined, false]);
  await assert.rejects(sbx.updateNetwork({ allowOut: ["203.0.113.10"], denyOut: [ALL_TRAFFIC] }), /has no network/);
});
