/**
 * What the SDK sends for options the live tests do not exercise (networks, limits, backends),
 * captured by a stand-in server: camelCase and milliseconds in, the service's snake_case and
 * seconds out.
 */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";
import { InvalidArgumentError, Sandbox } from "../src/index";
import "./helpers";

const INFO = {
  id: "sbx-00000000000000cc", state: "running", backend: "gvisor", image: "img-1", created_ms: 1_700_000_000_000,
  parent_snapshot: null, limits: { memory_mib: 1024, cpus: 2, pids: 512 }, metadata: {}, expires_ms: null,
  on_timeout: "kill", created_by: null, lost_reason: null, flagged: null,
};

/** The stand-in's answers to the fleet's routes. */
const ANSWERS: Record<string, unknown> = {
  "/v1/snapshots/warm/push": { snapshot: "snap-00000000000000aa", chunks: 3, sent_chunks: 2, sent_bytes: 200, skipped_bytes: 100, seconds: 0.5 },
  "/v1/snapshots/pull": {
    snapshot: "snap-00000000000000aa", chunks: 3, fetched_bytes: 300, reused_bytes: 0, peer_bytes: 0, s3_bytes: 300,
    peer_error: "did not answer", seconds: 0.25,
  },
  "/v1/fleet/capacity": { sandboxes: 2, max_sandboxes: 8, room: 6 },
};

describe("request bodies (stand-in server)", () => {
  let server: Server;
  /** The unanswered-peers header the stand-in's next listings carry, when set. */
  let unanswered: string | undefined;
  let url: string;
  const got: { method: string; url: string; body: unknown }[] = [];
  before(async () => {
    server = createServer((req, res) => {
      let raw = "";
      req.on("data", (c) => (raw += c));
      req.on("end", () => {
        got.push({ method: req.method ?? "", url: req.url ?? "", body: raw ? JSON.parse(raw) : undefined });
        res.setHeader("content-type", "application/json");
        const path = (req.url ?? "").split("?")[0];
        const list = path === "/v1/sandboxes" && req.method === "GET";
        if (list && unanswered !== undefined) res.setHeader("x-branchbox-peers-unanswered", unanswered);
        res.end(JSON.stringify(ANSWERS[path ?? ""] ?? (list ? [{ ...INFO, node: "n3" }] : INFO)));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });
  const conn = () => ({ url, token: "stand-in-token-0123456789" });

  test("create: options become the service's fields, milliseconds become seconds", async () => {
    await Sandbox.create({
      ...conn(), timeoutMs: 1500, onTimeout: "pause", metadata: { a: "1" }, envs: { B: "2" }, backend: "gvisor",
      memoryMib: 512, cpus: 1, pids: 64, network: { mode: "allow_list", allow: ["192.0.2.0/24"] },
    });
    assert.deepEqual(got.at(-1), {
      method: "POST", url: "/v1/sandboxes",
      body: {
        timeout: 1.5, on_timeout: "pause", metadata: { a: "1" }, envs: { B: "2" }, backend: "gvisor",
        memory_mib: 512, cpus: 1, pids: 64, network: { mode: "allow_list", allow: ["192.0.2.0/24"] },
      },
    });
    await Sandbox.create("base", { ...conn(), allowInternetAccess: false, network: undefined });
    assert.deepEqual(got.at(-1)!.body, { template: "default", allow_internet_access: false });
    await Sandbox.create({ ...conn(), network: { mode: "internet" }, snapshotId: "warm" });
    assert.deepEqual(got.at(-1)!.body, { snapshot_id: "warm", network: { mode: "internet" } });
    const n = got.length;
    await assert.rejects(Sandbox.create({ ...conn(), snapshotId: "../etc" }), InvalidArgumentError);
    await assert.rejects(Sandbox.create({ ...conn(), timeoutMs: -1 }), InvalidArgumentError);
    assert.equal(got.length, n, "nothing was sent for refused options");
  });

  test("list: metadata as one encoded query value, one state to the service, several filtered here", async () => {
    await Sandbox.list({ ...conn(), query: { metadata: { team: "a b", x: "1" }, state: "running" } });
    const u = new URL(got.at(-1)!.url, url);
    assert.equal(u.searchParams.get("metadata"), "team=a+b&x=1");
    assert.equal(u.searchParams.get("state"), "running");
    const both = await Sandbox.list({ ...conn(), query: { state: ["paused", "lost"] } });
    assert.equal(new URL(got.at(-1)!.url, url).searchParams.has("state"), false);
    assert.deepEqual(both, [], "a running sandbox is not paused or lost");
  });

  test("list: local=true only when asked; each entry's node; unanswered peers read from the header", async () => {
    const whole = await Sandbox.list({ ...conn() });
    assert.equal(new URL(got.at(-1)!.url, url).searchParams.has("local"), false);
    assert.equal(whole[0]!.node, "n3");
    assert.deepEqual([whole.partial, whole.unanswered], [false, {}]);
    await Sandbox.list({ ...conn(), local: true });
    assert.equal(new URL(got.at(-1)!.url, url).searchParams.get("local"), "true");

    unanswered = "n4 (no answer in 3 s), n5 (did not answer: error (refused), again), __proto__ (answered 500)";
    try {
      const part = await Sandbox.list({ ...conn() });
      assert.equal(part.partial, true);
      assert.deepEqual({ ...part.unanswered }, {
        n4: "no answer in 3 s", n5: "did not answer: error (refused), again", ["__proto__"]: "answered 500",
      });
      assert.equal(JSON.stringify(part), JSON.stringify([...part]), "the extra properties stay out of its JSON");
      unanswered = "not the service's shape";
      assert.deepEqual((await Sandbox.list({ ...conn() })).unanswered, { "?": "not the service's shape" });
    } finally {
      unanswered = undefined;
    }
  });

  test("pushSnapshot, pullSnapshot and fleetCapacity: routes, bodies and camelCase answers", async () => {
    assert.deepEqual(await Sandbox.pushSnapshot("warm", conn()), {
      snapshot: "snap-00000000000000aa", chunks: 3, sentChunks: 2, sentBytes: 200, skippedBytes: 100, seconds: 0.5,
    });
    assert.deepEqual(got.at(-1), { method: "POST", url: "/v1/snapshots/warm/push", body: undefined });
    const pulled = await Sandbox.pullSnapshot("snap-00000000000000aa", { ...conn(), peer: "n3" });
    assert.deepEqual(got.at(-1)!.body, { id: "snap-00000000000000aa", peer: "n3" });
    assert.deepEqual(pulled, {
      snapshot: "snap-00000000000000aa", chunks: 3, fetchedBytes: 300, reusedBytes: 0, peerBytes: 0, s3Bytes: 300,
      peerError: "did not answer", seconds: 0.25,
    });
    await Sandbox.pullSnapshot("snap-00000000000000aa", conn());
    assert.deepEqual(got.at(-1)!.body, { id: "snap-00000000000000aa" });
    assert.deepEqual(await Sandbox.fleetCapacity(conn()), { sandboxes: 2, maxSandboxes: 8, room: 6 });
    const n = got.length;
    await assert.rejects(Sandbox.pushSnapshot("../etc", conn()), InvalidArgumentError);
    await assert.rejects(Sandbox.pullSnapshot("a/b", conn()), InvalidArgumentError);
    assert.equal(got.length, n, "nothing was sent for refused references");
  });

  test("connect and setTimeout send seconds; a template's sandbox runs as the service's default user", async () => {
    const s = await Sandbox.connect(INFO.id, { ...conn(), timeoutMs: 90_000 });
    assert.deepEqual(got.at(-1), { method: "POST", url: `/v1/sandboxes/${INFO.id}/connect`, body: { timeout: 90 } });
    await s.setTimeout(2500);
    assert.deepEqual(got.at(-1), { method: "POST", url: `/v1/sandboxes/${INFO.id}/timeout`, body: { timeout: 2.5 } });
    await s.setTimeout(0);
    assert.deepEqual(got.at(-1), { method: "POST", url: `/v1/sandboxes/${INFO.id}/timeout`, body: { timeout: 0 } });
    await assert.rejects(s.setTimeout(-1), InvalidArgumentError);
    assert.equal(s.defaultUser, "user");
    assert.equal((await Sandbox.create({ ...conn(), template: "web" })).defaultUser, undefined);
    assert.equal((await Sandbox.create({ ...conn(), image: "minimal" })).defaultUser, undefined);
    assert.equal((await Sandbox.create({ ...conn(), image: "minimal", user: "root" })).defaultUser, "root");
  });
});
