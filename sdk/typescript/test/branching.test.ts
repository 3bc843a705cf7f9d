import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { BranchboxError, InvalidArgumentError, Sandbox } from "../src/index";
import { killAll, sandbox } from "./helpers";

describe("fork, checkpoint, rollback, snapshots", () => {
  let sbx: Sandbox;
  const made: unknown[] = [];
  before(async () => {
    sbx = await sandbox({ metadata: { suite: "ts-branching" } });
  });
  after(async () => {
    await killAll(sbx, ...made);
  });

  test("fork({count: 2}): each child continues from the parent's state and then diverges", async () => {
    await sbx.files.write("shared.txt", "before the fork");
    // A process running at the fork continues in every child, with its memory.
    const counter = await sbx.commands.run(
      "python3 -c 'import time\nn = 0\nwhile True:\n    n += 1\n    open(\"/tmp/n\", \"w\").write(str(n))\n    time.sleep(0.05)'",
      { background: true, timeoutMs: 0 },
    );
    assert.ok(counter.pid > 0);
    const children = await sbx.fork({ count: 2 });
    made.push(...children);
    assert.equal(children.length, 2);
    const kids = children.map((c) => {
      assert.ok(c instanceof Sandbox, `a child failed: ${c}`);
      return c;
    });
    assert.notEqual(kids[0]!.sandboxId, kids[1]!.sandboxId);
    for (const [i, k] of kids.entries()) {
      assert.equal(await k.files.read("shared.txt"), "before the fork");
      assert.equal((await k.commands.run("whoami")).stdout, "user\n", "a child runs as its parent does");
      await k.files.write("mine.txt", `child ${i}`);
      const procs = await k.commands.list();
      assert.ok(procs.some((p) => p.pid === counter.pid && p.running), "the counter runs on in the child");
    }
    assert.equal(await kids[0]!.files.read("mine.txt"), "child 0");
    assert.equal(await kids[1]!.files.read("mine.txt"), "child 1");
    assert.equal(await sbx.files.exists("mine.txt"), false, "the parent does not see its children's files");
    for (const k of kids) {
      const info = await k.getInfo();
      assert.deepEqual(info.metadata, { suite: "ts-branching" }, "children inherit metadata");
      assert.ok(info.parentSnapshot, "a child has a parent snapshot");
    }
    const lineage = await sbx.lineage();
    for (const k of kids) {
      const fp = lineage.parentOf(k.sandboxId);
      assert.ok(fp, "the lineage has each child's fork point");
      assert.equal(lineage.parentOf(fp), sbx.sandboxId);
    }
    await killAll(...kids);
    await sbx.commands.kill(counter.pid);
  });

  test("checkpoint then rollback restores a file in place, same sandbox id", async () => {
    await sbx.files.write("state.txt", "checkpointed");
    const cp = await sbx.checkpoint();
    assert.match(cp.snapshotId, /^snap-[0-9a-f]{16}$/);
    assert.equal(cp.kind, "checkpoint");
    assert.equal(cp.source, sbx.sandboxId);

    await sbx.files.write("state.txt", "changed");
    await sbx.files.write("after.txt", "made after the checkpoint");
    const info = await sbx.rollback(cp.snapshotId);
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.equal(await sbx.files.read("state.txt"), "checkpointed");
    assert.equal(await sbx.files.exists("after.txt"), false);
    assert.ok((await sbx.checkpoints()).some((c) => c.snapshotId === cp.snapshotId));
    assert.ok((await sbx.lineage()).snapshots.some((s) => s.snapshotId === cp.snapshotId));
  });

  test("createSnapshot({name}) then Sandbox.create({snapshotId}) starts from it", async () => {
    const name = `ts-warm-${randomBytes(4).toString("hex")}`;
    await sbx.files.write("warm.txt", "warmed up");
    const snap = await sbx.createSnapshot({ name });
    assert.equal(snap.name, name);
    assert.equal(snap.kind, "snapshot");
    assert.ok((await Sandbox.listSnapshots()).some((s) => s.snapshotId === snap.snapshotId));

    for (const ref of [name, snap.snapshotId]) {
      const restored = await Sandbox.create({ snapshotId: ref, timeoutMs: 600_000 });
      made.push(restored);
      assert.notEqual(restored.sandboxId, sbx.sandboxId);
      assert.equal(await restored.files.read("warm.txt"), "warmed up");
      assert.equal((await restored.getInfo()).parentSnapshot, snap.snapshotId);
      await restored.kill();
    }
  });

  test("snapshot names are checked before anything is sent", async () => {
    for (const bad of ["..", "a/b", "-x", "has space", "snap-0123456789abcdef", ""]) {
      await assert.rejects(sbx.createSnapshot({ name: bad }), InvalidArgumentError, bad);
    }
    await assert.rejects(sbx.rollback("../x"), (e: unknown) => e instanceof BranchboxError && e.code === "invalid_id");
  });
});
