/**
 * The naming rule for snapshot names and refs, the same as the service's, the CLI's and the
 * Python SDK's: checked here too, so a name like `..` or `a/b` is refused with a clear error
 * before it becomes part of a URL (docs/limits.md).
 */

import { InvalidArgumentError } from "./errors";

/** Longest name, in bytes of UTF-8. */
export const MAX_NAME_BYTES = 128;

export const NAME_RULE =
  "1-128 bytes of printable characters without spaces or '/', not starting with '-', " +
  "not '.' or '..', and not shaped like an id (snap-/sbx- and 16 hex digits)";

const ID = /^(snap|sbx)-[0-9a-f]{16}$/;
const SNAPSHOT_ID = /^snap-[0-9a-f]{16}$/;

function why(s: unknown): string | undefined {
  if (typeof s !== "string") return "it is not a string";
  if (!s) return "it is empty";
  const size = Buffer.byteLength(s, "utf8");
  if (size > MAX_NAME_BYTES) return `it is ${size} bytes long, over the limit of ${MAX_NAME_BYTES}`;
  if (s === "." || s === "..") return "'.' and '..' are path components";
  if (s.startsWith("-")) return "a leading '-' reads as a command-line option";
  for (const c of s) {
    // Control characters (Unicode category Cc) and white space, as Python's `isspace`.
    if (c === "/" || /\p{Cc}/u.test(c) || /\s/u.test(c)) {
      return `it contains ${JSON.stringify(c)}`;
    }
  }
  if (ID.test(s)) return "it has the shape of an id, so lookups would be ambiguous";
  return undefined;
}

/** Returns `s` when it is a valid name; throws `InvalidArgumentError` naming it otherwise. */
export function checkName(what: string, s: unknown): string {
  const w = why(s);
  if (w !== undefined) {
    throw new InvalidArgumentError(`invalid ${what} ${JSON.stringify(s)}: ${w}; use ${NAME_RULE}`, { code: "invalid_name" });
  }
  return s as string;
}

/** Returns `s` when it is a snapshot id or a valid name (or ref). */
export function checkSnapshotRef(s: unknown): string {
  if (typeof s === "string" && SNAPSHOT_ID.test(s)) return s;
  if (why(s) !== undefined) {
    throw new InvalidArgumentError(
      `${JSON.stringify(s)} is neither a snapshot id (snap-<16 hex digits>) nor a valid name (${NAME_RULE})`,
      { code: "invalid_id" },
    );
  }
  return s as string;
}
