/**
 * The terminal client against a stand-in server that speaks the documented protocol of
 * `GET /v1/sandboxes/{id}/pty` (binary input and output, JSON `resize`, `exit` and `error`
 * messages, the service's error body on a refused upgrade): the client's side of the protocol,
 * tested whether or not this branchboxd serves the route yet (test/pty.test.ts runs the real one).
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { Duplex } from "node:stream";
import { after, before, describe, test } from "node:test";
import { WebSocketServer, type WebSocket } from "ws";
import { Http } from "../src/http";
import { BranchboxError, InvalidArgumentError, NotFoundError, Sandbox, ServiceUnavailableError } from "../src/index";

const ID = "sbx-00000000000000aa";
const TOKEN = "stand-in-token-0123456789";

describe("pty protocol (stand-in server)", () => {
  let server: Server;
  let url: string;
  const seen: { query: URLSearchParams; authorization: string | undefined }[] = [];
  const resizes: string[] = [];

  before(async () => {
    const wss = new WebSocketServer({ noServer: true });
    server = createServer((_req, res) => res.writeHead(404).end());
    server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
      const u = new URL(req.url ?? "/", "http://x");
      if (u.pathname !== `/v1/sandboxes/${ID}/pty`) {
        const body = JSON.stringify({ error: { code: "not_found", message: "no such route; GET /openapi.json lists them" } });
        socket.end(`HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
        return;
      }
      seen.push({ query: u.searchParams, authorization: req.headers.authorization });
      wss.handleUpgrade(req, socket, head, (ws: WebSocket) => {
        const cmd = u.searchParams.get("cmd");
        if (cmd === "fail") {
          ws.send(JSON.stringify({ type: "error", code: "spawn_failed", message: "no such program: fail" }));
          ws.close(1000);
          return;
        }
        if (cmd === "drop") {
          ws.terminate();
          return;
        }
        ws.send(Buffer.from(`$ ${u.searchParams.get("cols")}x${u.searchParams.get("rows")}\r\n`), { binary: true });
        ws.on("message", (data: Buffer, isBinary: boolean) => {
          if (!isBinary) {
            resizes.push(data.toString());
            const m = JSON.parse(data.toString()) as { cols: number; rows: number };
            ws.send(Buffer.from(`resized ${m.cols}x${m.rows}\r\n`), { binary: true });
            return;
          }
          const text = data.toString("utf8");
          const exit = /^exit (\d+)\n$/.exec(text);
          if (exit) {
            ws.send(JSON.stringify({ type: "exit", code: Number(exit[1]), signal: null }));
            ws.close(1000);
          } else if (text === "kill\n") {
            ws.send(JSON.stringify({ type: "exit", code: null, signal: 9 }));
            ws.close(1000);
          } else {
            ws.send(data, { binary: true });
          }
        });
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  const box = (id = ID) => new Sandbox(id, new Http({ url, token: TOKEN, requestTimeoutMs: 10_000 }));

  test("connects with the size, command, user and cwd in the query and the token in the header", async () => {
    let out = "";
    const pty = await box().pty.create({ cols: 120, rows: 40, cmd: "bash -l", cwd: "work", onData: (d) => void (out += Buffer.from(d).toString()) });
    const q = seen.at(-1)!;
    assert.equal(q.authorization, `Bearer ${TOKEN}`);
    assert.deepEqual(Object.fromEntries(q.query), { cols: "120", rows: "40", cmd: "bash -l", user: "user", cwd: "/home/user/work" });
    await pty.sendInput("héllo\n");
    await pty.sendInput(new Uint8Array([0x01, 0xff, 0x0a]));
    await pty.resize({ cols: 90, rows: 20 });
    await pty.sendInput("exit 5\n");
    assert.deepEqual(await pty.wait(), { exitCode: 5, signal: null });
    const bytes = Buffer.from(out, "utf8");
    assert.ok(out.startsWith("$ 120x40\r\n"), out);
    assert.ok(out.includes("héllo\n"));
    assert.ok(bytes.includes(Buffer.from([0x01])));
    assert.ok(out.includes("resized 90x20"));
    assert.deepEqual(JSON.parse(resizes.at(-1)!), { type: "resize", cols: 90, rows: 20 });
    await assert.rejects(pty.sendInput("x"), BranchboxError);
  });

  test("defaults are 80x24; a signal ends it with a null exit code", async () => {
    const pty = await box().pty.create();
    assert.equal(seen.at(-1)!.query.get("cols"), "80");
    assert.equal(seen.at(-1)!.query.get("rows"), "24");
    assert.equal(seen.at(-1)!.query.has("cmd"), false);
    await pty.sendInput("kill\n");
    assert.deepEqual(await pty.wait(), { exitCode: null, signal: 9 });
  });

  test("an error message rejects wait() with the typed error of its code", async () => {
    const pty = await box().pty.create({ cmd: "fail" });
    await assert.rejects(pty.wait(), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, `got ${e}`);
      assert.equal(e.code, "spawn_failed");
      assert.match(e.message, /no such program/);
      return true;
    });
  });

  test("a connection that drops without an exit message rejects wait()", async () => {
    const pty = await box().pty.create({ cmd: "drop" });
    await assert.rejects(pty.wait(), (e: unknown) => e instanceof BranchboxError && e.code === "stream_cut");
  });

  test("a refused upgrade is the service's typed error; kill() ends a running terminal", async () => {
    await assert.rejects(box("sbx-00000000000000bb").pty.create(), (e: unknown) => {
      assert.ok(e instanceof NotFoundError, `got ${e}`);
      assert.equal(e.status, 404);
      assert.match(e.message, /no such route/);
      return true;
    });
    const pty = await box().pty.create();
    assert.equal(await pty.kill(), true);
    assert.equal(await pty.kill(), false);
    await assert.rejects(box().pty.create({ rows: 0 }), InvalidArgumentError);
  });

  test("no server at all is a ServiceUnavailableError", async () => {
    const dead = new Sandbox(ID, new Http({ url: "http://127.0.0.1:1", token: TOKEN, requestTimeoutMs: 5_000 }));
    await assert.rejects(dead.pty.create(), ServiceUnavailableError);
  });
});
