// The branchbox console: plain JavaScript, no framework. Every value from the service is put
// into the page as text (never as HTML), and the page's CSP allows no inline script.
"use strict";

// The session's CSRF token, handed out only by sign-in. It is kept in this origin's
// sessionStorage (per port, unlike cookies, and readable by the terminal's frame) and sent with
// every request: the session cookie alone, which the browser also sends to other ports of this
// host, authorises nothing.
const CSRF_KEY = "bbx_csrf";
const S = {
  csrf: sessionStorage.getItem(CSRF_KEY) || "",
  sandboxes: [],
  lineage: { snapshots: [], sandboxes: [] },
  expanded: new Set(),
  collapsed: new Set(),
  zoom: 1,
  events: null,
  node: null,
};
// Trees up to this size start fully expanded; larger ones start with only their roots shown,
// and a node's children are built only when it is expanded.
const OPEN_UP_TO = 200;
// Longest list of paths drawn per section of a diff.
const DIFF_SHOWN = 2000;

const $ = (id) => document.getElementById(id);

function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function report(ok, text) {
  const r = $("result");
  r.className = ok ? "ok" : "error";
  r.textContent = text;
}

async function api(method, path, body) {
  const headers = {};
  if (S.csrf) headers["x-csrf-token"] = S.csrf;
  if (body !== undefined) headers["content-type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = text; }
  }
  if (!r.ok) {
    const e = (data && data.error) || { code: String(r.status), message: text };
    const err = new Error(e.message);
    err.code = e.code;
    err.status = r.status;
    throw err;
  }
  return data;
}

// Runs an action, showing that it runs, then its result or its error.
async function act(label, fn) {
  report(true, label + " …");
  try {
    const out = await fn();
    report(true, label + ": " + out);
    refresh();
  } catch (e) {
    report(false, label + " failed: " + (e.code ? e.code + ": " : "") + e.message);
    if (e.status === 401 || e.code === "csrf") showSignIn("Signed out: " + e.message);
  }
}

// ---- time and sizes -------------------------------------------------------------------------

function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}
const age = (ms) => span(Date.now() - ms);
const ttl = (sb) => (sb.expires_ms == null ? "—" : span(sb.expires_ms - Date.now()));
const mib = (b) => (b / 1048576).toFixed(1) + " MiB";
const metaText = (m) => Object.entries(m || {}).map(([k, v]) => k + "=" + v).join(", ");

// ---- sign-in and the event stream -----------------------------------------------------------

function showSignIn(why) {
  stopEvents();
  S.csrf = "";
  sessionStorage.removeItem(CSRF_KEY);
  for (const p of ["page-sandboxes", "page-lineage", "page-node"]) $(p).hidden = true;
  $("nav").hidden = true;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("page-signin").hidden = false;
  $("signin-error").textContent = why || "";
}

function signedIn(s) {
  S.csrf = s.csrf;
  if (s.csrf) sessionStorage.setItem(CSRF_KEY, s.csrf);
  $("who").textContent = s.auth ? "signed in as " + s.who : "authentication is off";
  $("signout").hidden = !s.auth;
  $("nav").hidden = false;
  $("page-signin").hidden = true;
  $("token").value = "";
  startEvents();
  refresh();
  route();
}

function stopEvents() {
  if (S.events) S.events.close();
  S.events = null;
  $("live").textContent = "";
}

// Live updates: the service sends the sandbox list and the lineage whenever they change.
function startEvents() {
  stopEvents();
  // EventSource cannot send headers: the token goes in the query.
  const es = new EventSource("/ui/api/events?" + new URLSearchParams({ csrf: S.csrf }));
  S.events = es;
  es.onopen = () => { $("live").textContent = "live"; };
  es.addEventListener("sandboxes", (e) => { S.sandboxes = JSON.parse(e.data); redraw(); });
  es.addEventListener("lineage", (e) => { S.lineage = JSON.parse(e.data); redraw(); });
  es.addEventListener("failure", (e) => {
    const f = JSON.parse(e.data).error;
    report(false, "live update failed: " + f.code + ": " + f.message);
  });
  es.onerror = () => {
    $("live").textContent = "reconnecting";
    // A refused stream (signed out, service busy) is not retried by the browser: check the
    // session after a pause, then sign in again or start a new stream.
    if (es.readyState === EventSource.CLOSED) {
      setTimeout(() => {
        if (S.events !== es) return;
        api("GET", "/ui/api/session").then(startEvents, (e) => showSignIn("Signed out: " + e.message));
      }, 3000);
    }
  };
}

// Fetches both views at once, after an action or when the page opens.
async function refresh() {
  try {
    const [boxes, lineage] = await Promise.all([api("GET", "/v1/sandboxes"), api("GET", "/v1/lineage")]);
    S.sandboxes = boxes;
    S.lineage = lineage;
    redraw();
  } catch (e) {
    if (e.status === 401 || e.code === "csrf") showSignIn("Signed out: " + e.message);
  }
}

function redraw() {
  if (!$("page-sandboxes").hidden) drawSandboxes();
  if (!$("page-lineage").hidden) drawTree();
  if (!$("page-node").hidden && S.node) drawNodeInfo();
}

// ---- pages ----------------------------------------------------------------------------------

function route() {
  if (!$("page-signin").hidden) return;
  const h = location.hash || "#/sandboxes";
  const [, page, id] = h.split("/");
  for (const p of ["sandboxes", "lineage", "node"]) $("page-" + p).hidden = p !== page;
  for (const p of ["sandboxes", "lineage"]) $("nav-" + p).classList.toggle("current", p === page);
  if (page === "node" && id) openNode(decodeURIComponent(id));
  else if (page === "lineage") drawTree();
  else {
    $("page-sandboxes").hidden = false;
    drawSandboxes();
  }
}

function nodeLink(id, label) {
  return el("a", { href: "#/node/" + encodeURIComponent(id), class: "id", text: label || id });
}

function drawSandboxes() {
  const words = $("filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  const state = $("state-filter").value;
  const body = $("sandboxes-table").tBodies[0];
  const rows = [];
  for (const sb of S.sandboxes) {
    const hay = [sb.id, sb.state, sb.backend, sb.image, metaText(sb.metadata)].join(" ").toLowerCase();
    if (state && sb.state !== state) continue;
    if (!words.every((w) => hay.includes(w))) continue;
    rows.push(el("tr", { "data-id": sb.id },
      el("td", {}, nodeLink(sb.id)),
      el("td", {}, el("span", { class: "state " + sb.state, text: sb.state })),
      el("td", { text: sb.backend }),
      el("td", { text: sb.image }),
      el("td", { text: age(sb.created_ms) }),
      el("td", { text: sb.limits.memory_mib + " MiB" }),
      el("td", { text: ttl(sb) }),
      el("td", { text: metaText(sb.metadata) })));
  }
  body.replaceChildren(...rows);
  $("sandbox-count").textContent = rows.length + " of " + S.sandboxes.length;
}

// ---- the lineage tree -----------------------------------------------------------------------

// Builds the tree `branchbox log` draws: a snapshot under its parent snapshot, a sandbox under
// the snapshot it descends from; snapshots first, then sandboxes, each oldest first.
function buildTree() {
  const nodes = new Map();
  for (const s of S.lineage.snapshots) nodes.set(s.id, { type: s.kind, data: s, kids: [] });
  for (const b of S.lineage.sandboxes) nodes.set(b.id, { type: "sandbox", data: b, kids: [] });
  const roots = [];
  for (const s of S.lineage.snapshots) {
    const p = s.parent && nodes.get(s.parent);
    (p && p.type !== "sandbox" ? p.kids : roots).push(nodes.get(s.id));
  }
  for (const b of S.lineage.sandboxes) {
    const p = b.parent_snapshot && nodes.get(b.parent_snapshot);
    (p && p.type !== "sandbox" ? p.kids : roots).push(nodes.get(b.id));
  }
  const order = (a, b) =>
    (a.type === "sandbox") - (b.type === "sandbox") || (a.data.created_ms || 0) - (b.data.created_ms || 0);
  for (const n of nodes.values()) n.kids.sort(order);
  roots.sort(order);
  return { nodes, roots };
}

function isOpen(id, total) {
  if (S.collapsed.has(id)) return false;
  return S.expanded.has(id) || total <= OPEN_UP_TO;
}

function nodeLabel(n) {
  const d = n.data;
  const parts = [el("span", { class: "kind " + n.type, text: n.type.replace("_", " ") }), nodeLink(d.id)];
  if (n.type === "sandbox") {
    parts.push(" ", el("span", { class: "state " + d.state, text: d.state }));
  } else {
    if (d.name) parts.push(" “" + d.name + "”");
    for (const r of d.refs || []) parts.push(" ", el("span", { class: "ref", text: r }));
    if (d.source) parts.push(el("span", { class: "muted", text: " of " + d.source }));
    if (d.deleted) parts.push(el("span", { class: "deleted", text: " deleted" }));
    parts.push(el("span", { class: "muted", text: " " + age(d.created_ms) + " ago" }));
  }
  return parts;
}

// One node; its children are built only while it is open.
function drawNode(n, total, counter) {
  counter.shown++;
  const li = el("li", { "data-id": n.data.id });
  if (n.kids.length) {
    const open = isOpen(n.data.id, total);
    li.append(el("button", {
      type: "button",
      class: "toggle",
      "aria-expanded": String(open),
      title: (open ? "Collapse " : "Expand ") + n.kids.length,
      text: open ? "▾" : "▸",
      onclick: () => {
        if (open) { S.collapsed.add(n.data.id); S.expanded.delete(n.data.id); }
        else { S.expanded.add(n.data.id); S.collapsed.delete(n.data.id); }
        drawTree();
      },
    }));
    li.append(...nodeLabel(n));
    if (!open) li.append(el("span", { class: "muted", text: " (" + n.kids.length + " below)" }));
    else li.append(el("ul", {}, ...n.kids.map((k) => drawNode(k, total, counter))));
  } else {
    li.append(el("span", { class: "toggle" }), ...nodeLabel(n));
  }
  return li;
}

function drawTree() {
  const { nodes, roots } = buildTree();
  const counter = { shown: 0 };
  $("tree").replaceChildren(...roots.map((r) => drawNode(r, nodes.size, counter)));
  $("tree").style.fontSize = S.zoom + "em";
  $("lineage-count").textContent = nodes.size + " nodes, " + counter.shown + " shown";
  return nodes;
}

function setAll(open) {
  const { nodes } = buildTree();
  S.expanded.clear();
  S.collapsed.clear();
  for (const [id, n] of nodes) if (n.kids.length) (open ? S.expanded : S.collapsed).add(id);
  drawTree();
}

// Opens the path to the first node whose id or name contains the text, and marks it.
function find(text) {
  const q = text.trim().toLowerCase();
  if (!q) return;
  const { nodes } = buildTree();
  const hit = [...nodes.values()].find((n) => n.data.id.includes(q) || (n.data.name || "").toLowerCase().includes(q));
  if (!hit) { report(false, "no node matches " + JSON.stringify(text)); return; }
  const parentOf = (d) => d.parent_snapshot || d.parent;
  for (let p = parentOf(hit.data), seen = 0; p && nodes.has(p) && seen < nodes.size; p = parentOf(nodes.get(p).data), seen++) {
    S.expanded.add(p);
    S.collapsed.delete(p);
  }
  drawTree();
  const li = $("tree").querySelector('li[data-id="' + CSS.escape(hit.data.id) + '"]');
  if (li) { li.classList.add("found"); li.scrollIntoView({ block: "center" }); }
}

// ---- a node's page --------------------------------------------------------------------------

function openNode(id) {
  S.node = id;
  $("node-title").textContent = id;
  $("node-diff").replaceChildren();
  $("node-timeline").replaceChildren();
  $("node-terminal").replaceChildren();
  drawNodeInfo();
  if (id.startsWith("sbx-")) { sandboxActions(id); terminalFrame(id); timelineFrame(id); }
  else snapshotActions(id);
}

function row(k, v) {
  return [el("dt", { text: k }), el("dd", {}, v == null || v === "" ? "—" : v)];
}

async function drawNodeInfo() {
  const id = S.node;
  try {
    if (id.startsWith("sbx-")) {
      const sb = await api("GET", "/v1/sandboxes/" + encodeURIComponent(id));
      if (S.node !== id) return;
      $("node-title").textContent = "Sandbox " + id;
      $("node-info").replaceChildren(
        ...row("state", el("span", { class: "state " + sb.state, text: sb.state })),
        ...row("backend", sb.backend), ...row("image", sb.image),
        ...row("created", new Date(sb.created_ms).toISOString() + " (" + age(sb.created_ms) + " ago)"),
        ...row("parent", sb.parent_snapshot ? nodeLink(sb.parent_snapshot) : null),
        ...row("limits", sb.limits.memory_mib + " MiB, " + sb.limits.cpus + " CPU, " + sb.limits.pids + " pids"),
        ...row("TTL", ttl(sb) + (sb.expires_ms == null ? "" : ", then " + sb.on_timeout)),
        ...row("metadata", metaText(sb.metadata)), ...row("created by", sb.created_by),
        ...row("lost because", sb.lost_reason));
      fillRollback(id);
      drawTimeline(id);
    } else {
      const s = await api("GET", "/v1/snapshots/" + encodeURIComponent(id));
      if (S.node !== id) return;
      $("node-title").textContent = s.kind.replace("_", " ") + " " + id;
      $("node-info").replaceChildren(
        ...row("kind", s.kind), ...row("name", s.name),
        ...row("created", new Date(s.created_ms).toISOString() + " (" + age(s.created_ms) + " ago)"),
        ...row("size", s.deleted ? "deleted" : mib(s.size_bytes)),
        ...row("parent", s.parent ? nodeLink(s.parent) : null),
        ...row("taken of", s.source ? nodeLink(s.source) : null),
        ...row("backend", s.backend), ...row("image", s.image),
        ...row("limits", s.limits.memory_mib + " MiB, " + s.limits.cpus + " CPU, " + s.limits.pids + " pids"));
      fillAgainst(s);
      const refs = (await api("GET", "/v1/refs")).filter((r) => r.snapshot === id).map((r) => r.name);
      if (S.node !== id) return;
      $("node-info").append(...row("refs", refs.join(", ")));
    }
  } catch (e) {
    if (S.node !== id) return;
    $("node-info").replaceChildren(...row("error", (e.code || "") + ": " + e.message));
    if (e.status === 401 || e.code === "csrf") showSignIn("Signed out: " + e.message);
  }
}

function action(label, inputs, button) {
  return el("div", { class: "action" }, el("label", { text: label }), ...inputs, button);
}

function sandboxActions(id) {
  const path = "/v1/sandboxes/" + encodeURIComponent(id);
  const cpName = el("input", { id: "checkpoint-name", placeholder: "name (optional)" });
  const snapName = el("input", { id: "snapshot-name", placeholder: "name", required: "" });
  const count = el("input", { id: "fork-count", type: "number", min: "1", value: "1" });
  const target = el("select", { id: "rollback-to" });
  const secs = el("input", { id: "timeout-s", type: "number", min: "1", value: "300" });
  const named = (v) => (v.trim() ? { name: v.trim() } : {});
  $("node-actions").replaceChildren(
    el("h2", { text: "Actions" }),
    action("Checkpoint", [cpName], el("button", { id: "do-checkpoint", type: "button", text: "Checkpoint",
      onclick: () => act("checkpoint", async () => (await api("POST", path + "/checkpoints", named(cpName.value))).id) })),
    action("Snapshot", [snapName], el("button", { id: "do-snapshot", type: "button", text: "Snapshot",
      onclick: () => act("snapshot", async () => (await api("POST", path + "/snapshots", named(snapName.value))).id) })),
    action("Fork", [count], el("button", { id: "do-fork", type: "button", text: "Fork",
      onclick: () => act("fork", async () => {
        const r = await api("POST", path + "/fork", { count: Number(count.value) });
        const ok = r.children.filter((c) => c.ok).map((c) => c.sandbox.id);
        const bad = r.children.filter((c) => !c.ok).map((c) => c.error.code + ": " + c.error.message);
        return "fork point " + r.snapshot.id + "; children " + ok.join(", ") + (bad.length ? "; failed: " + bad.join("; ") : "");
      }) })),
    action("Roll back to", [target], el("button", { id: "do-rollback", type: "button", class: "danger", text: "Roll back",
      onclick: () => {
        if (!target.value) { report(false, "roll back: take a checkpoint first"); return; }
        if (!confirm("Roll " + id + " back to " + target.value + "? Its state since then is lost.")) return;
        act("rollback", async () => (await api("POST", path + "/rollback", { checkpoint: target.value })).id + " is back at " + target.value);
      } })),
    action("Timeout (s)", [secs], el("button", { id: "do-timeout", type: "button", text: "Set timeout",
      onclick: () => act("timeout", async () => "expires in " + ttl(await api("POST", path + "/timeout", { timeout: Number(secs.value) }))) })),
    action("Kill", [], el("button", { id: "do-kill", type: "button", class: "danger", text: "Kill",
      onclick: () => {
        if (!confirm("Kill " + id + "? Everything in it is lost.")) return;
        act("kill", async () => { await api("DELETE", path); location.hash = "#/sandboxes"; return id + " killed"; });
      } })));
  fillRollback(id);
}

// The rollback targets: checkpoints and snapshots taken of the sandbox, newest first.
function fillRollback(id) {
  const sel = $("rollback-to");
  if (!sel) return;
  const was = sel.value;
  const mine = S.lineage.snapshots
    .filter((s) => s.source === id && !s.deleted && s.kind !== "fork_point")
    .sort((a, b) => b.created_ms - a.created_ms);
  sel.replaceChildren(...mine.map((s) => el("option", { value: s.id, text: s.id + " " + s.kind + (s.name ? " “" + s.name + "”" : "") })));
  if (mine.some((s) => s.id === was)) sel.value = was;
}

function snapshotActions(id) {
  const against = el("select", { id: "diff-against" });
  // A ref (a movable name, `branchbox ref`) is made, or moved from wherever it pointed.
  const refName = el("input", { id: "ref-name", placeholder: "ref name (made or moved)" });
  $("node-actions").replaceChildren(
    el("h2", { text: "Actions" }),
    action("Restore", [], el("button", { id: "do-restore", type: "button", text: "Start a sandbox from it",
      onclick: () => act("restore", async () => {
        const sb = await api("POST", "/v1/sandboxes", { snapshot_id: id });
        return "started " + sb.id;
      }) })),
    action("Diff against", [against], el("button", { id: "do-diff", type: "button", text: "Show diff",
      onclick: () => showDiff(id, against.value) })),
    action("Ref", [refName], el("button", { id: "do-ref", type: "button", text: "Point the ref here",
      onclick: () => act("ref", async () => {
        const name = refName.value.trim();
        if (!name) throw new Error("give the ref a name");
        const r = await api("PUT", "/v1/refs/" + encodeURIComponent(name), { snapshot: id });
        drawNodeInfo();
        return "ref " + r.name + " now names " + r.snapshot;
      }) })));
}

// The nodes a snapshot may be compared with: its parent first, then every other live snapshot.
function fillAgainst(s) {
  const sel = $("diff-against");
  if (!sel) return;
  const was = sel.value;
  const others = S.lineage.snapshots.filter((o) => o.id !== s.id && !o.deleted);
  const opts = [];
  if (s.parent) opts.push(el("option", { value: s.parent, text: "parent " + s.parent }));
  for (const o of others) if (o.id !== s.parent) opts.push(el("option", { value: o.id, text: o.id + " " + o.kind + (o.name ? " “" + o.name + "”" : "") }));
  sel.replaceChildren(...opts);
  if (was && opts.some((o) => o.value === was)) sel.value = was;
}

async function showDiff(id, against) {
  const box = $("node-diff");
  if (!against) { report(false, "diff: no other snapshot to compare with"); return; }
  box.replaceChildren(el("p", { class: "muted", text: "Listing files (the first diff of a snapshot starts it once) …" }));
  try {
    const d = await api("GET", "/v1/snapshots/" + encodeURIComponent(id) + "/diff?against=" + encodeURIComponent(against));
    const section = (name, paths) => {
      const shown = paths.slice(0, DIFF_SHOWN).map((p) => el("li", { class: name },
        el("button", { type: "button", class: "path", title: "Show the text diff of " + p, text: p,
          onclick: () => showFileDiff(id, d.from, p) })));
      if (paths.length > DIFF_SHOWN) shown.push(el("li", { class: "muted", text: "… " + (paths.length - DIFF_SHOWN) + " more" }));
      return el("div", { class: "diff", id: "diff-" + name }, el("h3", { text: name + " (" + paths.length + ")" }), el("ul", {}, ...shown));
    };
    box.replaceChildren(
      el("h2", {}, "Files from ", nodeLink(d.from), " to ", nodeLink(d.to)),
      el("p", { class: "muted", text: "Listings are compared (type, size, mode, modification time). Click a path for its text diff (text files up to 256 KiB)." }),
      el("div", { id: "file-diff" }),
      section("added", d.added), section("changed", d.changed), section("removed", d.removed));
    report(true, "diff: " + d.added.length + " added, " + d.changed.length + " changed, " + d.removed.length + " removed");
  } catch (e) {
    box.replaceChildren();
    report(false, "diff failed: " + (e.code ? e.code + ": " : "") + e.message);
  }
}

// The text diff of one file between the two sides of the diff shown.
async function showFileDiff(id, against, path) {
  const box = $("file-diff");
  if (!box) return;
  box.replaceChildren(el("p", { class: "muted", text: "Reading " + path + " (the first read of a file starts its snapshot once) …" }));
  report(true, "file diff …");
  try {
    const d = await api("GET", "/v1/snapshots/" + encodeURIComponent(id) + "/diff/file?path=" +
      encodeURIComponent(path) + "&against=" + encodeURIComponent(against));
    const side = (s) => s.state.replace("_", " ") + (s.size == null ? "" : " (" + s.size + " bytes)");
    const parts = [
      el("h3", { text: path }),
      el("p", { class: "muted", text: "from " + side(d.old) + " in " + d.from + " to " + side(d.new) + " in " + d.to }),
    ];
    if (d.unified != null) {
      // The first two lines name the sides; a removed line may start with "--" itself.
      const kind = (line, i) => (i < 2 || line.startsWith("\\") ? "meta" : line.startsWith("@@") ? "hunk"
        : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "ctx");
      const lines = d.unified.split("\n");
      if (lines[lines.length - 1] === "") lines.pop();
      parts.push(el("pre", { class: "udiff", id: "udiff" }, ...lines.map((l, i) => el("span", { class: kind(l, i), text: l }))));
    } else {
      const odd = [["old", d.old], ["new", d.new]].filter(([, s]) => s.state !== "text" && s.state !== "absent");
      const why = d.identical ? "The file is the same on both sides."
        : odd.length ? "No text diff: " + odd.map(([n, s]) => "the " + n + " side is " + side(s)).join(" and ") + "."
        : "Neither side has this path.";
      parts.push(el("p", { id: "udiff-none", text: why }));
    }
    box.replaceChildren(...parts);
    box.scrollIntoView({ block: "start" });
    report(true, "file diff: " + path + ": +" + d.added_lines + " −" + d.removed_lines + " lines");
  } catch (e) {
    box.replaceChildren();
    report(false, "file diff failed: " + (e.code ? e.code + ": " : "") + e.message);
    if (e.status === 401 || e.code === "csrf") showSignIn("Signed out: " + e.message);
  }
}

// ---- a terminal into a sandbox --------------------------------------------------------------

// A shell in the sandbox, in a frame of /ui/terminal.html (xterm.js over the pty WebSocket).
// Closing the frame closes the socket, which ends the shell.
function terminalFrame(id) {
  const box = $("node-terminal");
  const open = el("button", { id: "open-terminal", type: "button", text: "Open a terminal" });
  const close = el("button", { id: "close-terminal", type: "button", text: "Close the terminal", hidden: "" });
  const slot = el("div", { id: "terminal-slot" });
  open.onclick = () => {
    slot.replaceChildren(el("iframe", { id: "terminal-frame", class: "terminal",
      title: "terminal of " + id, src: "/ui/terminal.html?id=" + encodeURIComponent(id) }));
    open.hidden = true;
    close.hidden = false;
  };
  close.onclick = () => {
    slot.replaceChildren();
    open.hidden = false;
    close.hidden = true;
  };
  box.replaceChildren(el("h2", { text: "Terminal" }),
    el("p", { class: "muted", text: "A login shell as root on a terminal in the sandbox; it ends when the terminal is closed." }),
    open, close, slot);
}

// ---- a sandbox's timeline -------------------------------------------------------------------

// Most sandboxes one "fork" of a timeline entry starts.
const FORK_MAX = 16;

// The timeline's frame: the step-history toggle and the fork count stay while the list below
// them is redrawn.
function timelineFrame(id) {
  const path = "/v1/sandboxes/" + encodeURIComponent(id);
  const toggle = el("input", { id: "history-toggle", type: "checkbox",
    onchange: () => {
      // Updates arriving meanwhile leave the box as clicked until the service answers.
      toggle.dataset.pending = "1";
      act("history", async () => {
        const sb = await api("POST", path + "/history", { enabled: toggle.checked });
        return "step history " + (sb.history ? "on: every command ends with a checkpoint" : "off");
      }).finally(() => { delete toggle.dataset.pending; drawTimeline(id); });
    } });
  const count = el("input", { id: "timeline-fork-count", type: "number", min: "1", max: String(FORK_MAX), value: "2" });
  $("node-timeline").replaceChildren(
    el("h2", { text: "Timeline" }),
    el("div", { class: "toolbar" },
      el("label", {}, toggle, " Step history (a checkpoint after every command)"),
      el("span", { class: "spacer" }),
      el("label", {}, "Fork count ", count)),
    el("ol", { id: "timeline", class: "timeline" }),
    el("p", { id: "timeline-note", class: "muted" }));
}

function exitText(step) {
  if (step.exit_code != null) return "exit " + step.exit_code;
  if (step.signal != null) return "signal " + step.signal;
  return "no exit code";
}

// Starts `n` sandboxes from a snapshot, one after another; says which started and which failed.
async function restoreMany(snap, n) {
  const ok = [];
  const bad = [];
  for (let i = 0; i < n; i++) {
    try {
      ok.push((await api("POST", "/v1/sandboxes", { snapshot_id: snap })).id);
    } catch (e) {
      if (!ok.length && !bad.length) throw e;
      bad.push((e.code ? e.code + ": " : "") + e.message);
    }
  }
  return "started " + ok.join(", ") + " from " + snap + (bad.length ? "; failed: " + bad.join("; ") : "");
}

function timelineEntry(id, t, e) {
  const s = e.snapshot;
  const step = e.step;
  const when = new Date(step ? step.ended_ms : s.created_ms);
  const parts = [
    el("span", { class: "when", title: when.toISOString(), text: when.toLocaleTimeString() }),
    el("span", { class: "kind " + s.kind, text: s.kind.replace("_", " ") }),
  ];
  if (step) {
    parts.push(el("code", { class: "cmd", title: "ran " + step.duration_ms + " ms", text: step.command }),
      el("span", { class: "exit " + (step.exit_code === 0 ? "ok" : "bad"), text: exitText(step) }));
  } else {
    parts.push(el("span", { class: "cmd muted", text: s.name ? "“" + s.name + "”" : "no command recorded" }));
  }
  parts.push(nodeLink(s.id));
  if (s.id === t.current) parts.push(el("span", { class: "here", text: "← now" }));
  if (s.deleted) {
    parts.push(el("span", { class: "deleted", text: "deleted" }));
    return el("li", { "data-id": s.id }, ...parts);
  }
  const what = step ? " (after “" + step.command + "”)" : "";
  const path = "/v1/sandboxes/" + encodeURIComponent(id);
  parts.push(el("span", { class: "actions" },
    el("button", { type: "button", class: "tl-rollback danger", text: "Roll back",
      onclick: () => {
        if (!confirm("Roll " + id + " back to " + s.id + what + "? Its state since then is lost.")) return;
        act("rollback", async () => (await api("POST", path + "/rollback", { checkpoint: s.id })).id + " is back at " + s.id);
      } }),
    el("button", { type: "button", class: "tl-restore", text: "Restore",
      onclick: () => act("restore", () => restoreMany(s.id, 1)) }),
    el("button", { type: "button", class: "tl-fork", text: "Fork",
      title: "Start the fork count of new sandboxes from this point",
      onclick: () => {
        const n = Number($("timeline-fork-count").value);
        if (!(n >= 1 && n <= FORK_MAX)) { report(false, "fork: the count must be 1 to " + FORK_MAX); return; }
        act("fork", () => restoreMany(s.id, n));
      } })));
  return el("li", { "data-id": s.id, class: s.id === t.current ? "current" : "" }, ...parts);
}

// The snapshots taken of a sandbox, oldest first, each step-history checkpoint with its command.
async function drawTimeline(id) {
  const list = $("timeline");
  if (!list) return;
  let t;
  try {
    t = await api("GET", "/v1/sandboxes/" + encodeURIComponent(id) + "/timeline");
  } catch (e) {
    if (S.node === id) $("timeline-note").textContent = "timeline failed: " + (e.code ? e.code + ": " : "") + e.message;
    return;
  }
  if (S.node !== id || $("timeline") !== list) return;
  const toggle = $("history-toggle");
  if (!toggle.dataset.pending) toggle.checked = t.history;
  // Redrawn only when it changed, so a button under the pointer stays put between updates.
  const key = JSON.stringify(t);
  if (list.dataset.key === key) return;
  list.dataset.key = key;
  list.replaceChildren(...t.entries.map((e) => timelineEntry(id, t, e)));
  $("timeline-note").textContent = t.entries.length ? ""
    : "No checkpoints or snapshots of this sandbox yet." + (t.history ? "" : " Turn step history on to take one after every command.");
}

// ---- wiring ---------------------------------------------------------------------------------

function wire() {
  $("signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      signedIn(await api("POST", "/ui/api/session", { token: $("token").value }));
      report(true, "signed in");
    } catch (e) {
      $("signin-error").textContent = e.message;
    }
  });
  $("signout").addEventListener("click", async () => {
    try { await api("DELETE", "/ui/api/session"); } catch (_) { /* signed out either way */ }
    showSignIn("Signed out.");
    report(true, "signed out");
  });
  $("filter").addEventListener("input", drawSandboxes);
  $("state-filter").addEventListener("change", drawSandboxes);
  $("create").addEventListener("click", () =>
    act("create", async () => "started " + (await api("POST", "/v1/sandboxes", {})).id));
  $("expand-all").addEventListener("click", () => setAll(true));
  $("collapse-all").addEventListener("click", () => setAll(false));
  $("zoom-in").addEventListener("click", () => { S.zoom = Math.min(2, S.zoom + 0.1); drawTree(); });
  $("zoom-out").addEventListener("click", () => { S.zoom = Math.max(0.5, S.zoom - 0.1); drawTree(); });
  $("find").addEventListener("change", (e) => find(e.target.value));
  window.addEventListener("hashchange", route);
  // Ages and TTLs count down between updates.
  setInterval(() => { if (!$("page-sandboxes").hidden) drawSandboxes(); }, 5000);
}

wire();
// A reloaded page asks whether its session is still live, proving it holds the CSRF token;
// without one (a new tab, or authentication on and never signed in here) it signs in.
api("GET", "/ui/api/session").then(signedIn, () => showSignIn(""));
