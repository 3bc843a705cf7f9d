/**
 * Checks the SDK's table of what it uses (`ROUTES` in src/wire.ts) against an OpenAPI 3.1
 * document: every route and query parameter exists, every field the SDK sends or reads exists
 * with the JSON type the SDK gives it, answers' non-null fields are required and not nullable,
 * request fields the SDK may leave out are not required, and fields the service requires are
 * sent. Returns one line per problem.
 */

import type { Field, RouteUse, Shape } from "../src/wire";

// The document is JSON of any shape; the checks below look before they use.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

interface Norm {
  types: Set<string>;
  enum?: Set<string>;
  obj?: Json;
  items?: Json;
  additional?: Json;
}

function deref(doc: Json, s: Json, seen = new Set<string>()): Json {
  while (s && typeof s === "object" && typeof s.$ref === "string") {
    if (seen.has(s.$ref)) throw new Error(`a $ref cycle at ${s.$ref}`);
    seen.add(s.$ref);
    const parts = (s.$ref as string).replace(/^#\//, "").split("/");
    s = parts.reduce((o: Json, p) => (o ? o[p] : undefined), doc);
  }
  return s;
}

function norm(doc: Json, raw: Json): Norm {
  const s = deref(doc, raw);
  const n: Norm = { types: new Set() };
  if (!s || typeof s !== "object") return n;
  for (const key of ["oneOf", "anyOf", "allOf"]) {
    for (const member of (s[key] as Json[] | undefined) ?? []) {
      const m = norm(doc, member);
      m.types.forEach((t) => n.types.add(t));
      if (m.enum) n.enum = new Set([...(n.enum ?? []), ...m.enum]);
      n.obj ??= m.obj;
      n.items ??= m.items;
      n.additional ??= m.additional;
    }
  }
  if (typeof s.type === "string") n.types.add(s.type);
  if (Array.isArray(s.type)) s.type.forEach((t: string) => n.types.add(t));
  if (Array.isArray(s.enum)) n.enum = new Set([...(n.enum ?? []), ...s.enum.filter((v: unknown) => v !== null)]);
  if (s.properties) n.obj = s;
  if (s.items) n.items = s.items;
  if (s.additionalProperties && typeof s.additionalProperties === "object") n.additional = s.additionalProperties;
  return n;
}

type Dir = "request" | "response";

function fieldKind(f: Field): { kind: string; nullable: boolean; arg?: Shape | readonly string[] } {
  if (typeof f === "string") {
    const nullable = f.endsWith("?");
    return { kind: nullable ? f.slice(0, -1) : f, nullable };
  }
  const [k, arg] = f;
  const nullable = k.endsWith("?");
  return { kind: nullable ? k.slice(0, -1) : k, nullable, arg };
}

function has(n: Norm, t: string): boolean {
  return n.types.has(t);
}

function checkField(doc: Json, where: string, schema: Json, f: Field, dir: Dir, out: string[]): void {
  const n = norm(doc, schema);
  const { kind, nullable, arg } = fieldKind(f);
  const shown = [...n.types].join("|") || "untyped";
  const expect = (ok: boolean, what: string) => {
    if (!ok) out.push(`${where}: the SDK ${dir === "request" ? "sends" : "reads"} ${what}, the spec says ${shown}`);
  };
  if (dir === "response" && !nullable && has(n, "null")) {
    out.push(`${where}: the spec lets it be null, the SDK's type does not`);
  }
  switch (kind) {
    case "string":
      return expect(has(n, "string"), "a string");
    case "boolean":
      return expect(has(n, "boolean"), "a boolean");
    case "integer":
      return expect(has(n, "integer"), "an integer");
    case "number":
      return expect(has(n, "number") || (dir === "response" && has(n, "integer")), "a number");
    case "string[]":
      expect(has(n, "array"), "an array of strings");
      if (has(n, "array")) expect(has(norm(doc, n.items), "string"), "an array of strings (items)");
      return;
    case "map":
      expect(has(n, "object"), "an object of strings");
      if (has(n, "object")) {
        const v = norm(doc, n.additional);
        if (!has(v, "string")) out.push(`${where}: the SDK takes an object of strings, the spec's values are ${[...v.types].join("|") || "untyped"}`);
      }
      return;
    case "obj":
      expect(has(n, "object") || n.obj !== undefined, "an object");
      if (n.obj) checkShape(doc, where, n.obj, arg as Shape, dir, out);
      return;
    case "arr": {
      expect(has(n, "array"), "an array of objects");
      const items = norm(doc, n.items);
      if (items.obj) checkShape(doc, `${where}[]`, items.obj, arg as Shape, dir, out);
      else if (has(n, "array")) out.push(`${where}[]: the spec's items are not objects`);
      return;
    }
    case "enum": {
      expect(has(n, "string"), "a string (one of a set)");
      const mine = new Set(arg as readonly string[]);
      if (n.enum) {
        // What the SDK sends must be accepted; what the service answers must be known.
        const missing = dir === "request" ? [...mine].filter((v) => !n.enum!.has(v)) : [...n.enum].filter((v) => !mine.has(v));
        if (missing.length) {
          out.push(dir === "request"
            ? `${where}: the SDK sends ${missing.join(", ")}, which the spec does not list`
            : `${where}: the spec may answer ${missing.join(", ")}, which the SDK does not know`);
        }
      }
      return;
    }
    default:
      out.push(`${where}: the SDK's table has an unknown type ${JSON.stringify(f)}`);
  }
}

function checkShape(doc: Json, where: string, obj: Json, shape: Shape, dir: Dir, out: string[]): void {
  const props = (obj.properties ?? {}) as Record<string, Json>;
  const required = new Set<string>(obj.required ?? []);
  for (const [k, f] of Object.entries(shape)) {
    const at = `${where}.${k}`;
    if (!(k in props)) {
      out.push(`${at}: the SDK ${dir === "request" ? "sends" : "reads"} it, the spec has no such field`);
      continue;
    }
    checkField(doc, at, props[k], f, dir, out);
    const optional = fieldKind(f).nullable;
    if (dir === "response" && !optional && !required.has(k)) out.push(`${at}: the SDK counts on it, the spec does not require it`);
    if (dir === "request" && optional && required.has(k)) out.push(`${at}: the spec requires it, the SDK may leave it out`);
  }
  if (dir === "request") {
    for (const k of required) if (!(k in shape)) out.push(`${where}.${k}: the spec requires it, the SDK never sends it`);
  }
}

function jsonSchema(content: Json): Json {
  return content?.["application/json"]?.schema;
}

/** Problems of the SDK's routes against the document; empty when they agree. */
export function checkRoutes(doc: Json, routes: readonly RouteUse[]): string[] {
  const out: string[] = [];
  for (const r of routes) {
    const name = `${r.method} ${r.path}`;
    const item = doc.paths?.[r.path];
    const op = item?.[r.method.toLowerCase()];
    if (!op) {
      out.push(`${name}: no such route in the spec`);
      continue;
    }
    const params = [...(item.parameters ?? []), ...(op.parameters ?? [])].map((p: Json) => deref(doc, p));
    for (const q of r.query ?? []) {
      if (!params.some((p: Json) => p.in === "query" && p.name === q)) out.push(`${name}: no query parameter ${q} in the spec`);
    }
    if (r.request) {
      const s = jsonSchema(deref(doc, op.requestBody)?.content);
      const n = norm(doc, s);
      if (!n.obj && !has(n, "object")) out.push(`${name}: the SDK sends a JSON object, the spec takes none`);
      else checkShape(doc, `${name} request`, n.obj ?? { properties: {} }, r.request, "request", out);
    }
    if (r.response) {
      const ok = Object.keys(op.responses ?? {}).filter((c) => /^2\d\d$/.test(c)).sort()[0];
      const s = ok === undefined ? undefined : jsonSchema(deref(doc, op.responses[ok])?.content);
      if (!s) {
        out.push(`${name}: the SDK reads a JSON answer, the spec has none`);
        continue;
      }
      let n = norm(doc, s);
      let where = `${name} answer`;
      if (r.list) {
        if (!has(n, "array")) {
          out.push(`${name}: the SDK reads an array, the spec answers ${[...n.types].join("|")}`);
          continue;
        }
        n = norm(doc, n.items);
        where += "[]";
      }
      if (!n.obj) out.push(`${name}: the SDK reads an object, the spec answers ${[...n.types].join("|")}`);
      else checkShape(doc, where, n.obj, r.response, "response", out);
    }
  }
  return out;
}

/** Problems of one named schema against a shape the SDK reads. */
export function checkSchema(doc: Json, name: string, shape: Shape): string[] {
  const s = doc.components?.schemas?.[name];
  if (!s) return [`components.schemas.${name}: no such schema in the spec`];
  const out: string[] = [];
  checkShape(doc, name, norm(doc, s).obj ?? s, shape, "response", out);
  return out;
}
