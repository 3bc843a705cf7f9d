import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import { ROUTES } from "../src/index";
import { ERROR_BODY, type RouteUse } from "../src/wire";
import { service } from "./helpers";
import { checkRoutes, checkSchema } from "./spec";

// The document is JSON of any shape.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

// The live document, fetched once: what this branchboxd serves now.
let doc: Json;

describe("the SDK's routes and fields against the live /openapi.json", () => {
  before(async () => {
    const svc = service();
    const r = await fetch(`${svc.url}/openapi.json`, { headers: { authorization: `Bearer ${svc.token}` } });
    assert.equal(r.status, 200);
    doc = await r.json();
  });

  test("every route, query parameter and field the SDK uses exists with the SDK's JSON type", () => {
    assert.match(String(doc.openapi), /^3\.1\./);
    const problems = [...checkRoutes(doc, ROUTES), ...checkSchema(doc, "ErrorBody", ERROR_BODY)];
    assert.deepEqual(problems, []);
    assert.ok(ROUTES.length >= 25, "the table lists the SDK's routes");
  });

  test("the check fails when the spec drops, renames or retypes what the SDK uses", () => {
    const clone = () => JSON.parse(JSON.stringify(doc));
    const s = (d: Json) => d.components.schemas;
    const cases: [string, (d: Json) => void, RegExp][] = [
      ["a dropped answer field", (d) => delete s(d).SandboxInfo.properties.expires_ms, /SandboxInfo|expires_ms/],
      ["a renamed answer field", (d) => {
        const p = s(d).CommandResult.properties;
        p.exitcode = p.exit_code;
        delete p.exit_code;
      }, /exit_code/],
      ["a retyped answer field", (d) => (s(d).SnapshotInfo.properties.size_bytes = { type: "string" }), /size_bytes/],
      ["an answer field made optional", (d) => (s(d).EntryInfo.required = s(d).EntryInfo.required.filter((k: string) => k !== "path")), /path/],
      ["a renamed request field", (d) => {
        const p = s(d).CreateSandbox.properties;
        p.snapshot = p.snapshot_id;
        delete p.snapshot_id;
      }, /snapshot_id/],
      ["a newly required request field", (d) => (s(d).RunCommand.required = ["cmd", "shell"]), /shell|cmd/],
      ["an enum value the SDK sends, dropped", (d) => (s(d).NetworkMode.enum = ["internet", "deny_all"]), /allow_list/],
      ["a state the SDK does not know", (d) => s(d).StateName.enum.push("frozen"), /frozen/],
      ["a dropped route", (d) => delete d.paths["/v1/sandboxes/{id}/fork"], /fork: no such route/],
      ["a dropped query parameter", (d) => {
        const op = d.paths["/v1/sandboxes/{id}/files/list"].get;
        op.parameters = op.parameters.filter((p: { name: string }) => p.name !== "path");
      }, /files\/list: no query parameter path/],
      ["a list answer that became an object", (d) => {
        d.paths["/v1/sandboxes"].get.responses["200"].content["application/json"].schema = { $ref: "#/components/schemas/SandboxInfo" };
      }, /reads an array/],
      ["a nested field dropped", (d) => delete s(d).LimitsInfo.properties.cpus, /limits\.cpus/],
    ];
    for (const [what, mutate, says] of cases) {
      const d = clone();
      mutate(d);
      const problems = [...checkRoutes(d, ROUTES), ...checkSchema(d, "ErrorBody", ERROR_BODY)];
      assert.ok(problems.length > 0, `${what}: not noticed`);
      assert.ok(problems.some((p) => says.test(p)), `${what}: ${problems.join("; ")}`);
    }
  });

  test("a route the spec lacks is named as such", () => {
    const extra: RouteUse[] = [{ method: "GET", path: "/v1/no-such-route", response: { id: "string" } }];
    assert.deepEqual(checkRoutes(doc, extra), ["GET /v1/no-such-route: no such route in the spec"]);
  });
});
