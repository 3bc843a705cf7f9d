import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { ConflictError, NotFoundError, PermissionDeniedError, Sandbox } from "../src/index";
import { sandbox } from "./helpers";

describe("files", () => {
  let sbx: Sandbox;
  before(async () => {
    sbx = await sandbox();
  });
  after(async () => {
    await sbx?.kill();
  });

  test("text round trip; a relative path is under /home/user and belongs to user", async () => {
    const info = await sbx.files.write("notes/plan.txt", "step 1\nstep 2 ✓\n");
    assert.deepEqual(info, { name: "plan.txt", type: "file", path: "/home/user/notes/plan.txt", size: 18 });
    assert.equal(await sbx.files.read("notes/plan.txt"), "step 1\nstep 2 ✓\n");
    assert.equal(await sbx.files.read("/home/user/notes/plan.txt"), "step 1\nstep 2 ✓\n");
    const owner = await sbx.commands.run("stat -c %U notes notes/plan.txt");
    assert.equal(owner.stdout, "user\nuser\n");
  });

  test("binary round trip: every byte value and 1 MiB of random bytes, as bytes, blob and stream", async () => {
    const all = new Uint8Array(256).map((_, i) => i);
    await sbx.files.write("/tmp/all.bin", all);
    assert.deepEqual(await sbx.files.read("/tmp/all.bin", { format: "bytes" }), all);

    const big = randomBytes(1 << 20);
    const w = await sbx.files.write("/tmp/big.bin", big.buffer.slice(big.byteOffset, big.byteOffset + big.byteLength));
    assert.equal(w.size, big.length);
    const sum = await sbx.commands.run("sha256sum /tmp/big.bin | cut -d' ' -f1");
    const { createHash } = await import("node:crypto");
    assert.equal(sum.stdout.trim(), createHash("sha256").update(big).digest("hex"));

    const blob = await sbx.files.read("/tmp/big.bin", { format: "blob" });
    assert.ok(Buffer.from(await blob.arrayBuffer()).equals(big));
    const chunks: Buffer[] = [];
    for await (const c of await sbx.files.read("/tmp/big.bin", { format: "stream" })) chunks.push(Buffer.from(c));
    assert.ok(Buffer.concat(chunks).equals(big));
  });

  test("a stream and a Blob can be written", async () => {
    const parts = [Buffer.from("one,"), Buffer.from("two,"), Buffer.from("three")];
    const stream = new ReadableStream<Uint8Array>({
      start(ctl) {
        for (const p of parts) ctl.enqueue(new Uint8Array(p));
        ctl.close();
      },
    });
    await sbx.files.write("/tmp/streamed.txt", stream);
    assert.equal(await sbx.files.read("/tmp/streamed.txt"), "one,two,three");
    await sbx.files.write("/tmp/blob.txt", new Blob(["from a blob"]));
    assert.equal(await sbx.files.read("/tmp/blob.txt"), "from a blob");
  });

  test("several files at once, with a mode", async () => {
    const infos = await sbx.files.write([
      { path: "many/a.txt", data: "A" },
      { path: "/tmp/many-b.txt", data: new Uint8Array([66]) },
    ]);
    assert.deepEqual(infos.map((i) => i.path), ["/home/user/many/a.txt", "/tmp/many-b.txt"]);
    assert.equal(await sbx.files.read("/tmp/many-b.txt"), "B");
    await sbx.files.write("/tmp/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
    assert.equal((await sbx.files.getInfo("/tmp/run.sh")).permissions, "rwxr-xr-x");
    assert.equal((await sbx.commands.run("/tmp/run.sh")).stdout, "ran\n");
  });

  test("list, exists, makeDir, rename, remove", async () => {
    assert.equal(await sbx.files.makeDir("tree/a/b"), true);
    assert.equal(await sbx.files.makeDir("tree/a/b"), false);
    await sbx.files.write("tree/a/f.txt", "f");
    const names = (await sbx.files.list("tree/a")).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["b:dir", "f.txt:file"]);
    const entry = (await sbx.files.list("tree/a")).find((e) => e.name === "f.txt");
    assert.equal(entry?.path, "/home/user/tree/a/f.txt");
    assert.equal(entry?.size, 1);
    assert.ok(entry?.modifiedTime instanceof Date && !Number.isNaN(entry.modifiedTime.getTime()));

    assert.equal(await sbx.files.exists("tree/a/f.txt"), true);
    assert.equal(await sbx.files.exists("tree/a/nope"), false);
    const moved = await sbx.files.rename("tree/a/f.txt", "tree/g.txt");
    assert.equal(moved.path, "/home/user/tree/g.txt");
    assert.equal(await sbx.files.exists("tree/a/f.txt"), false);
    assert.equal(await sbx.files.read("tree/g.txt"), "f");

    await sbx.files.remove("tree/g.txt");
    assert.equal(await sbx.files.exists("tree/g.txt"), false);
    await sbx.files.remove("tree");
    assert.equal(await sbx.files.exists("tree"), false);
  });

  test("every file call acts as the user: what its commands cannot touch, the files API refuses too", async () => {
    await sbx.files.write("/root/secret.txt", "s", { user: "root" });
    const cat = await sbx.commands.run("cat /root/secret.txt >/dev/null 2>&1; echo $?");
    assert.notEqual(cat.stdout.trim(), "0", "the user's commands can read root's file");
    await assert.rejects(sbx.files.read("/root/secret.txt"), PermissionDeniedError);
    await assert.rejects(sbx.files.list("/root"), PermissionDeniedError);
    await assert.rejects(sbx.files.getInfo("/root/secret.txt"), PermissionDeniedError);
    await assert.rejects(sbx.files.remove("/root/secret.txt"), PermissionDeniedError);
    await assert.rejects(sbx.files.rename("/root/secret.txt", "/root/taken.txt"), PermissionDeniedError);
    assert.equal(await sbx.files.read("/root/secret.txt", { user: "root" }), "s");
    assert.equal((await sbx.files.getInfo("/root/secret.txt", { user: "root" })).size, 1);
  });

  test("a missing file is a NotFoundError; a directory in the way of makeDir a ConflictError", async () => {
    await assert.rejects(sbx.files.read("/tmp/does-not-exist"), (e: unknown) => {
      assert.ok(e instanceof NotFoundError, `got ${e}`);
      assert.equal(e.status, 404);
      assert.equal(e.code, "path_not_found");
      return true;
    });
    await assert.rejects(sbx.files.remove("/tmp/does-not-exist"), NotFoundError);
    await sbx.files.write("/tmp/plainfile", "x");
    await assert.rejects(sbx.files.makeDir("/tmp/plainfile"), ConflictError);
  });
});
