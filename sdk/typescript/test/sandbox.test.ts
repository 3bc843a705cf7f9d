import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, describe, test } from "node:test";
import { AuthenticationError, BranchboxError, InvalidArgumentError, NotFoundError, Sandbox } from "../src/index";
import { killAll, sandbox, service } from "./helpers";

describe("sandbox lifecycle", () => {
  const made: Sandbox[] = [];
  after(async () => {
    await killAll(...made);
  });

  test("create, getInfo, list by metadata, connect, setTimeout, static kill", async () => {
    const tag = randomBytes(6).toString("hex");
    const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: "ts", tag }, envs: { FROM_CREATE: "yes" } });
    made.push(sbx);
    assert.match(sbx.sandboxId, /^sbx-[0-9a-f]{16}$/);

    const info = await sbx.getInfo();
    assert.equal(info.sandboxId, sbx.sandboxId);
    assert.equal(info.state, "running");
    assert.deepEqual(info.metadata, { suite: "ts", tag });
    assert.equal(info.templateId, info.image, "without a template, E2B's templateId is the image");
    assert.ok(info.startedAt instanceof Date);
    assert.ok(info.endAt instanceof Date);
    assert.equal(info.onTimeout, "kill");
    assert.ok(info.cpuCount > 0 && info.memoryMB > 0);
    assert.equal((await sbx.commands.run("echo $FROM_CREATE")).stdout, "yes\n");

    const listed = await Sandbox.list({ query: { metadata: { tag } } });
    assert.deepEqual(listed.map((i) => i.sandboxId), [sbx.sandboxId]);
    assert.deepEqual(await Sandbox.list({ query: { metadata: { tag }, state: "paused" } }), []);
    assert.deepEqual(
      (await Sandbox.list({ query: { metadata: { tag }, state: ["paused", "running"] } })).map((i) => i.sandboxId),
      [sbx.sandboxId],
    );

    // setTimeout moves the deadline: 120 s -> 600 s from now.
    const before = info.endAt!.getTime();
    await sbx.setTimeout(600_000);
    const later = (await sbx.getInfo()).endAt!.getTime();
    assert.ok(later - before > 400_000, `the deadline moved by ${later - before} ms`);
    await Sandbox.setTimeout(sbx.sandboxId, 300_000);
    assert.ok((await Sandbox.getInfo(sbx.sandboxId)).endAt!.getTime() < later);

    // Another client, by id: same sandbox, same files.
    await sbx.files.write("hello.txt", "from the first client");
    const again = await Sandbox.connect(sbx.sandboxId);
    assert.equal(again.sandboxId, sbx.sandboxId);
    assert.equal(await again.files.read("hello.txt"), "from the first client");

    assert.equal(await Sandbox.kill(sbx.sandboxId), true);
    assert.equal(await Sandbox.kill(sbx.sandboxId), false);
    assert.equal(await sbx.kill(), false);
    assert.equal(await sbx.isRunning(), false);
    await assert.rejects(sbx.getInfo(), NotFoundError);
    await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError);
    assert.deepEqual(await Sandbox.list({ query: { metadata: { tag } } }), []);
  });

  test("getHost: a sandbox without a network says it has none; a bad port is refused before sending", async () => {
    const sbx = await sandbox();
    made.push(sbx);
    await assert.rejects(sbx.getHost(8000), (e: unknown) => {
      assert.ok(e instanceof BranchboxError, `got ${e}`);
      assert.ok(e.status !== undefined && e.status >= 400 && e.status < 500, `status ${e.status}`);
      assert.match(e.message, /network/i);
      return true;
    });
    await assert.rejects(sbx.getHost(0), InvalidArgumentError);
    await assert.rejects(sbx.getHost(70000), InvalidArgumentError);
    assert.equal(sbx.proxyUrl(8000), `${service().url}/v1/sandboxes/${sbx.sandboxId}/ports/8000/`);
  });

  test("a wrong token is refused with AuthenticationError", async () => {
    const bad = { token: "not-the-token-" + randomBytes(8).toString("hex") };
    await assert.rejects(Sandbox.create(bad), (e: unknown) => {
      assert.ok(e instanceof AuthenticationError, `got ${e}`);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthorized");
      return true;
    });
    await assert.rejects(Sandbox.list(bad), AuthenticationError);
    await assert.rejects(Sandbox.create({ apiKey: "a", token: "b" }), InvalidArgumentError);
  });

  test("an unknown sandbox is a NotFoundError; a malformed id an InvalidArgumentError", async () => {
    await assert.rejects(Sandbox.connect("sbx-0000000000000000"), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.code, "not_found");
      return true;
    });
    await assert.rejects(Sandbox.getInfo("not-an-id"), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, `got ${e}`);
      assert.equal(e.code, "invalid_id");
      return true;
    });
  });
});
