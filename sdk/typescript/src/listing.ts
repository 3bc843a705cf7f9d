/**
 * What `Sandbox.list` answers: the sandboxes, and, for a listing through a node with fleet peers
 * (docs/fleet.md), the peers whose sandboxes it lacks because they did not answer, so that a
 * partial fleet is never taken for a whole one.
 */

import type { SandboxInfo } from "./models";

/** The answer header of a fleet listing naming the peers it lacks: `n4 (no answer in 3 s), ...`. */
export const UNANSWERED_HEADER = "x-branchbox-peers-unanswered";

/** One `NAME (REASON)` of that header: a peer name as peers files allow it, then the reason up
 *  to the next `, NAME (` or the end. */
const ITEM = /([A-Za-z0-9._-]{1,64}) \((.*?)\)(?:, (?=[A-Za-z0-9._-]{1,64} \()|$)/y;

/** The sandboxes a listing found (an array, as before), with what it lacks. */
export interface SandboxList extends Array<SandboxInfo> {
  /** Peers that did not answer, by name, each with why (`{n4: "no answer in 3 s"}`); empty
   *  when the listing is whole. */
  readonly unanswered: Readonly<Record<string, string>>;
  /** True when some peer's sandboxes are missing (`unanswered` is not empty). */
  readonly partial: boolean;
}

/** The peers the header names, each with why. A header that does not read as
 *  `NAME (REASON), ...` is kept whole under the name "?", never dropped. */
export function parseUnanswered(header: string | null): Record<string, string> {
  const raw = (header ?? "").trim();
  const found: Record<string, string> = {};
  ITEM.lastIndex = 0;
  while (ITEM.lastIndex < raw.length) {
    const m = ITEM.exec(raw);
    if (!m) return { "?": raw };
    // Defined, not assigned: a peer named `__proto__` is a name like any other.
    Object.defineProperty(found, m[1]!, { value: m[2]!, enumerable: true, writable: true, configurable: true });
  }
  return found;
}

/** `items` as a `SandboxList` whose `unanswered` is read from the answer's headers. The extra
 *  properties are not enumerable, so the list still compares and serialises as a plain array. */
export function sandboxList(items: SandboxInfo[], headers: Headers): SandboxList {
  const unanswered = Object.freeze(parseUnanswered(headers.get(UNANSWERED_HEADER)));
  return Object.defineProperties(items, {
    unanswered: { value: unanswered, enumerable: false },
    partial: { value: Object.keys(unanswered).length > 0, enumerable: false },
  }) as SandboxList;
}
