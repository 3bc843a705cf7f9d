// E2B's template builder in the JavaScript SDK (npm `e2b`'s `Template`, pinned) on branchboxd's
// template engine: the JavaScript side of sdk/python/tests/test_e2b_templates.py's first test.
// The JS SDK has no call that deletes a template (and E2B's DELETE /templates/{id} deletes
// snapshots only here), so the template is removed through branchbox's own API with the same key.
// The JS SDK's files hash of a directory counts its size on this disk, which the upload does not
// carry: branchboxd takes such a COPY unverified, for this template only, and its log says so.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Sandbox, Template } from "e2b";

/** branchbox's own API beside the E2B one run.mjs names (`<url>/e2b`). */
const V1 = process.env.E2B_API_URL.replace(/\/e2b$/, "/v1");

async function deleteTemplate(name) {
  const r = await fetch(`${V1}/templates/${encodeURIComponent(name)}`, {
    method: "DELETE",
    headers: { authorization: `Bearer ${process.env.E2B_API_KEY}` },
  });
  assert.ok(r.ok || r.status === 404, `deleting template ${name}: ${r.status} ${await r.text()}`);
}

test("a template built with the JS builder starts sandboxes with its files, env and workdir", async () => {
  const dir = mkdtempSync(join(tmpdir(), "e2bjs-tpl-"));
  const name = `e2bjs-tpl-${randomUUID().slice(0, 8)}`;
  try {
    writeFileSync(join(dir, "hello.txt"), "copied by the js builder\n");
    mkdirSync(join(dir, "conf", "sub"), { recursive: true });
    writeFileSync(join(dir, "conf", "sub", "b.ini"), "b = 2\n");
    writeFileSync(join(dir, "conf", "a.ini"), "a = 1\n");
    const template = Template({ fileContextPath: dir })
      .fromBaseImage()
      .runCmd("echo built > /built.txt && echo the-run-step-says-hi")
      .copy("hello.txt", "/srv/app/")
      .copy("conf/sub/b.ini", "/etc/app/")
      .copy("conf", "/opt/conf/")
      .setEnvs({ GREETING: "hi from the template" })
      .setWorkdir("/srv/app");
    const logs = [];
    const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) });
    assert.equal(info.templateId, name);
    assert.ok(logs.some((m) => m.includes("the-run-step-says-hi")), JSON.stringify(logs));
    assert.ok(logs.some((m) => m.includes(`template ${name} is ready`)), JSON.stringify(logs));
    const unchecked = logs.filter((m) => m.includes("the files hash could not be checked"));
    assert.equal(unchecked.length, 1, JSON.stringify(logs));
    assert.ok(unchecked[0].startsWith("step 4 (COPY conf)"), unchecked[0]);
    assert.equal(await Template.exists(name), true);
    assert.equal(await Template.exists(`${name}-none`), false);

    const s = await Sandbox.create(name, { timeoutMs: 120_000 });
    try {
      assert.equal(await s.files.read("/srv/app/hello.txt"), "copied by the js builder\n");
      assert.equal(await s.files.read("/etc/app/b.ini"), "b = 2\n");
      assert.equal(await s.files.read("/opt/conf/a.ini"), "a = 1\n");
      assert.equal(await s.files.read("/opt/conf/sub/b.ini"), "b = 2\n");
      const out = (await s.commands.run("pwd; echo $GREETING; cat /built.txt")).stdout;
      assert.equal(out, "/srv/app\nhi from the template\nbuilt\n");
      assert.equal((await s.getInfo()).templateId, name);
    } finally {
      await s.kill();
    }
  } finally {
    await deleteTemplate(name);
    rmSync(dir, { recursive: true, force: true });
  }
  assert.equal(await Template.exists(name), false, "the template outlived its deletion");
});
