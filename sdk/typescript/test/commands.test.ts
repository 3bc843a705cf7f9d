import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { CommandExitError, CommandTimeoutError, InvalidArgumentError, Sandbox, TimeoutError } from "../src/index";
import { sandbox } from "./helpers";

describe("commands", () => {
  let sbx: Sandbox;
  before(async () => {
    sbx = await sandbox();
  });
  after(async () => {
    await sbx?.kill();
  });

  test("run returns stdout and exit code 0, as user in /home/user by default", async () => {
    const r = await sbx.commands.run("python3 -c 'print(6 * 7)'; whoami; pwd");
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "42\nuser\n/home/user\n");
    assert.equal(r.error, undefined);
  });

  test("argv, envs, cwd and user reach the command", async () => {
    const r = await sbx.commands.run(["/bin/sh", "-c", 'echo "$GREETING $(id -un) $(pwd)"'], {
      envs: { GREETING: "hi there" },
      cwd: "/tmp",
      user: "root",
    });
    assert.equal(r.stdout, "hi there root /tmp\n");
    await sbx.files.makeDir("work/sub");
    const rel = await sbx.commands.run("pwd", { cwd: "work/sub" });
    assert.equal(rel.stdout, "/home/user/work/sub\n");
  });

  test("a non-zero exit rejects with CommandExitError carrying the result", async () => {
    await assert.rejects(sbx.commands.run("echo out; echo err >&2; exit 3"), (e: unknown) => {
      assert.ok(e instanceof CommandExitError, `got ${e}`);
      assert.ok(!(e instanceof TimeoutError));
      assert.equal(e.exitCode, 3);
      assert.equal(e.stdout, "out\n");
      assert.equal(e.stderr, "err\n");
      assert.equal(e.error, "err\n");
      assert.equal(e.result.exitCode, 3);
      assert.match(e.message, /exited with code 3/);
      return true;
    });
  });

  test("a command past its timeout is killed and rejects with TimeoutError (also a CommandExitError)", async () => {
    await assert.rejects(sbx.commands.run("echo started; sleep 30", { timeoutMs: 1000 }), (e: unknown) => {
      assert.ok(e instanceof TimeoutError, `got ${e}`);
      assert.ok(e instanceof CommandTimeoutError);
      assert.ok(e instanceof CommandExitError);
      assert.equal(e.timedOut, true);
      assert.equal(e.stdout, "started\n");
      return true;
    });
    // The whole process group went: nothing of it is left.
    const ps = await sbx.commands.run("ps -eo args | grep -c '[s]leep 30' || true");
    assert.equal(ps.stdout.trim(), "0");
  });

  test("onStdout and onStderr receive the output as it is produced, and the result has all of it", async () => {
    const out: string[] = [];
    const err: string[] = [];
    const r = await sbx.commands.run(
      "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done; printf 'caf\\303\\251\\n'",
      { onStdout: (d) => void out.push(d), onStderr: (d) => void err.push(d) },
    );
    assert.equal(out.join(""), "out1\nout2\nout3\ncafé\n");
    assert.equal(err.join(""), "err1\nerr2\nerr3\n");
    assert.equal(r.stdout, out.join(""));
    assert.equal(r.stderr, err.join(""));
    assert.equal(r.exitCode, 0);
  });

  test("a streamed command that fails rejects with CommandExitError after streaming its output", async () => {
    const out: string[] = [];
    await assert.rejects(
      sbx.commands.run("echo before; exit 7", { onStdout: (d) => void out.push(d) }),
      (e: unknown) => e instanceof CommandExitError && e.exitCode === 7,
    );
    assert.equal(out.join(""), "before\n");
  });

  test("a background process runs on, is listed, and its handle waits for its output", async () => {
    await sbx.files.write("/tmp/go", "");
    await sbx.files.remove("/tmp/go");
    const h = await sbx.commands.run("while [ ! -e /tmp/go ]; do sleep 0.1; done; echo done; echo warn >&2", {
      background: true,
    });
    assert.ok(h.pid > 0);
    const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid);
    assert.ok(listed, "the background process is listed");
    assert.equal(listed.running, true);
    // Still blocked: a short wait says so rather than returning.
    await assert.rejects(h.wait({ timeoutMs: 500 }), (e: unknown) => e instanceof TimeoutError);
    await sbx.files.write("/tmp/go", "");
    const r = await h.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "done\n");
    assert.equal(r.stderr, "warn\n");
    assert.equal(h.stdout, "done\n");
    assert.equal(h.exitCode, 0);
  });

  test("a background process can be killed; waiting on it then rejects with CommandExitError", async () => {
    const h = await sbx.commands.run("sleep 600", { background: true, timeoutMs: 0 });
    assert.equal(await h.kill(), true);
    await assert.rejects(h.wait(), (e: unknown) => e instanceof CommandExitError && e.signal === 9);
    assert.equal(await sbx.commands.kill(h.pid), false);
  });

  test("stdin is given to a command; a background process refuses it", async () => {
    const r = await sbx.commands.run("tr a-z A-Z", { stdin: "shout\n" });
    assert.equal(r.stdout, "SHOUT\n");
    await assert.rejects(
      sbx.commands.run("cat", { background: true, stdin: "x" }),
      (e: unknown) => e instanceof InvalidArgumentError,
    );
  });
});
