/**
 * Fleet listings through the SDK (docs/fleet.md, "Any node answers for the fleet"), without
 * Ray: a second branchboxd, node `nb`, whose peers file names the suite's service as `na`.
 * `Sandbox.list` through nb lists both nodes' sandboxes, each with its `node`; `local: true`
 * lists nb's own; a peer that does not answer (a closed loopback port) is named in the
 * answer's `unanswered`, with `partial` set, never dropped silently.
 */

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { closeSync, openSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Sandbox } from "../src/index";
import { killAll, service } from "./helpers";
import { Branchboxd, binaryPath, freePort } from "./serve";

/** Writes a peers file (mode 0600: it holds tokens). */
function writePeers(path: string, node: string, peers: Record<string, { url: string; token: string }>): void {
  const body = { node, peers: Object.entries(peers).map(([name, p]) => ({ name, url: p.url, token: p.token })) };
  const fd = openSync(path, "w", 0o600);
  try {
    writeSync(fd, JSON.stringify(body));
  } finally {
    closeSync(fd);
  }
}

describe("fleet listings through a node with a peer", () => {
  const tag = randomBytes(6).toString("hex");
  const data = join(service().work, `ts-${process.pid}-nb`);
  const peers = `${data}-peers.json`;
  const na = () => ({ url: service().url, token: service().token });
  let nb: Branchboxd | undefined;
  let onA: Sandbox | undefined;
  let onB: Sandbox | undefined;
  const viaB = () => ({ url: nb!.url, token: nb!.token });

  before(async () => {
    writePeers(peers, "nb", { na: na() });
    nb = await Branchboxd.start(binaryPath(), data, ["--peers", peers]);
    onA = await Sandbox.create({ timeoutMs: 300_000, metadata: { t: tag } });
    onB = await Sandbox.create({ timeoutMs: 300_000, metadata: { t: tag }, ...viaB() });
  });

  after(async () => {
    await killAll(onA, onB);
    const problems = nb ? await nb.stop() : [];
    rmSync(peers, { force: true });
    if (!problems.length) {
      rmSync(data, { recursive: true, force: true });
      rmSync(`${data}-branchboxd.log`, { force: true });
    }
    assert.deepEqual(problems, []);
  });

  test("a listing through nb has both nodes' sandboxes, each with its node, and is whole", async () => {
    const got = await Sandbox.list({ query: { metadata: { t: tag } }, ...viaB() });
    const nodes = Object.fromEntries(got.map((i) => [i.sandboxId, i.node]));
    assert.deepEqual(nodes, { [onA!.sandboxId]: "na", [onB!.sandboxId]: "nb" });
    assert.equal(got.partial, false);
    assert.deepEqual(got.unanswered, {});
    // A node without peers lists its own, with no node named.
    const plain = await Sandbox.list({ query: { metadata: { t: tag } } });
    assert.deepEqual(plain.map((i) => [i.sandboxId, i.node]), [[onA!.sandboxId, null]]);
  });

  test("local: true lists only the asked node's own sandboxes", async () => {
    const got = await Sandbox.list({ query: { metadata: { t: tag } }, local: true, ...viaB() });
    assert.deepEqual(got.map((i) => [i.sandboxId, i.node]), [[onB!.sandboxId, null]]);
    assert.equal(got.partial, false);
  });

  test("a peer that does not answer is named in unanswered, and what answered is still listed", async () => {
    const closed = await freePort();
    writePeers(peers, "nb", { na: na(), gone: { url: `http://127.0.0.1:${closed}`, token: "t".repeat(32) } });
    try {
      const got = await Sandbox.list({ query: { metadata: { t: tag } }, ...viaB() });
      assert.equal(got.partial, true);
      assert.deepEqual(Object.keys(got.unanswered), ["gone"]);
      assert.match(got.unanswered.gone!, /^did not answer/);
      assert.deepEqual(new Set(got.map((i) => i.sandboxId)), new Set([onA!.sandboxId, onB!.sandboxId]));
      // local: true asks no peer, so nothing is missing.
      assert.equal((await Sandbox.list({ local: true, ...viaB() })).partial, false);
    } finally {
      writePeers(peers, "nb", { na: na() });
    }
  });

  test("fleetCapacity counts the node's own sandboxes against its cap", async () => {
    const cap = await Sandbox.fleetCapacity(viaB());
    assert.equal(cap.sandboxes, 1);
    assert.equal(cap.room, cap.maxSandboxes - 1);
  });
});
