import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { join } from "node:path";
import { after, afterEach, before, beforeEach, describe, test } from "node:test";
import { AuthenticationError, Sandbox, proof } from "../src/index";
import { service } from "./helpers";

/** A local HTTP server that records what it was sent; `handle` answers. */
async function listen(handle: (url: string, headers: IncomingHttpHeaders, res: import("node:http").ServerResponse) => void) {
  const seen: { url: string; authorization: string | undefined }[] = [];
  const server: Server = createServer((req, res) => {
    seen.push({ url: req.url ?? "", authorization: req.headers.authorization });
    req.resume();
    req.on("end", () => handle(req.url ?? "", req.headers, res));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return { server, seen, port, close: () => new Promise<void>((r) => server.close(() => r())) };
}

/** A data directory whose service files say `url` and `token`. */
function dataDir(name: string, url: string, token: string): string {
  const d = join(service().work, `ts-${process.pid}-${name}`);
  mkdirSync(join(d, "service"), { recursive: true });
  writeFileSync(join(d, "service/url"), `${url}\n`);
  writeFileSync(join(d, "service/token"), `${token}\n`);
  return d;
}

describe("configuration from the data directory, and the service's proof", () => {
  const saved = { ...process.env };
  const dirs: string[] = [];
  before(() => service());
  beforeEach(() => {
    delete process.env.BRANCHBOX_URL;
    delete process.env.BRANCHBOX_TOKEN;
    delete process.env.E2B_API_KEY;
  });
  afterEach(() => {
    process.env = { ...saved };
  });
  after(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  test("proof() computes what the live service answers to a challenge, and only for its address", async () => {
    const svc = service();
    const nonce = randomBytes(32).toString("hex");
    const r = await fetch(`${svc.url}/v1/auth/challenge?nonce=${nonce}`);
    const answer = (await r.json()) as { listen: string; proofs: string[] };
    assert.equal(answer.listen, new URL(svc.url).host);
    assert.ok(answer.proofs.includes(proof(svc.token, answer.listen, nonce)));
    assert.ok(!answer.proofs.includes(proof(svc.token, "127.0.0.1:1", nonce)));
    assert.ok(!answer.proofs.includes(proof(`${svc.token}x`, answer.listen, nonce)));
  });

  test("url and token from <data>/service are used once the service proves it holds the token", async () => {
    process.env.BRANCHBOX_DATA = service().dataDir;
    const list = await Sandbox.list();
    assert.ok(Array.isArray(list));
  });

  test("a process on the service's port that cannot prove the token never receives it", async () => {
    const impostor = await listen((url, _h, res) => {
      res.setHeader("content-type", "application/json");
      if (url.startsWith("/v1/auth/challenge")) {
        res.end(JSON.stringify({ listen: `127.0.0.1:${impostor.port}`, proofs: ["00".repeat(32)] }));
      } else {
        res.end("[]");
      }
    });
    try {
      const token = service().token;
      const d = dataDir("impostor", `http://127.0.0.1:${impostor.port}`, token);
      dirs.push(d);
      process.env.BRANCHBOX_DATA = d;
      await assert.rejects(Sandbox.list(), (e: unknown) => {
        assert.ok(e instanceof AuthenticationError, `got ${e}`);
        assert.equal(e.code, "unverified_service");
        assert.match(e.message, /did not prove/);
        return true;
      });
      assert.ok(impostor.seen.length > 0, "the challenge was asked");
      assert.ok(impostor.seen.every((r) => r.url.startsWith("/v1/auth/challenge?nonce=")), "only the challenge was sent");
      assert.ok(impostor.seen.every((r) => r.authorization === undefined), "no token was sent");
    } finally {
      await impostor.close();
    }
  });

  test("a relay to the real service on another port is refused when the URL came from the url file", async () => {
    const target = new URL(service().url);
    const relay = await listen(() => undefined);
    // Forward every request as it is (the real service's proof comes back through it).
    relay.server.removeAllListeners("request");
    relay.server.on("request", (req, res) => {
      relay.seen.push({ url: req.url ?? "", authorization: req.headers.authorization });
      const fwd = request(
        { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: { ...req.headers, host: target.host } },
        (up) => {
          res.writeHead(up.statusCode ?? 502, up.headers);
          up.pipe(res);
        },
      );
      req.pipe(fwd);
    });
    try {
      const relayUrl = `http://127.0.0.1:${relay.port}`;
      const d = dataDir("relay", relayUrl, service().token);
      dirs.push(d);
      process.env.BRANCHBOX_DATA = d;
      await assert.rejects(Sandbox.list(), (e: unknown) => {
        assert.ok(e instanceof AuthenticationError, `got ${e}`);
        assert.equal(e.code, "unverified_service");
        assert.match(e.message, /proved itself for/);
        return true;
      });
      assert.ok(relay.seen.every((r) => r.authorization === undefined), "no token went through the relay");
      // A URL named explicitly may be a proxy or tunnel: there only the HMAC is checked.
      process.env.BRANCHBOX_URL = relayUrl;
      assert.ok(Array.isArray(await Sandbox.list()));
      assert.ok(relay.seen.some((r) => r.authorization === `Bearer ${service().token}`));
    } finally {
      relay.server.closeAllConnections();
      await relay.close();
    }
  });

  test("a token given in the environment is sent without a challenge (it was not read from disk)", async () => {
    const svc = service();
    process.env.BRANCHBOX_URL = svc.url;
    process.env.BRANCHBOX_TOKEN = svc.token;
    process.env.BRANCHBOX_DATA = join(svc.work, "no-such-data-dir");
    assert.ok(Array.isArray(await Sandbox.list()));
    process.env.BRANCHBOX_TOKEN = "";
    process.env.E2B_API_KEY = svc.token;
    assert.ok(Array.isArray(await Sandbox.list()), "E2B_API_KEY is the last resort");
  });
});
