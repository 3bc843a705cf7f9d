// A terminal into one sandbox: xterm.js over the WebSocket of GET /v1/sandboxes/{id}/pty.
// Opened as its own page (/ui/terminal.html?id=sbx-...), which the console embeds in a frame:
// xterm.js writes <style> elements, which only this page's policy allows.
"use strict";

const params = new URLSearchParams(location.search);
const id = params.get("id") || "";
const stateEl = document.getElementById("state");
document.getElementById("title").textContent = id;

function show(text, kind) {
  stateEl.textContent = text;
  stateEl.className = kind || "muted";
}

// The session's CSRF token, which the console keeps in this origin's sessionStorage (this
// page is the console's frame, so it shares it); the service never hands it out again. Without
// authentication there is none, and the session route says so.
async function csrfToken() {
  const csrf = sessionStorage.getItem("bbx_csrf") || "";
  const r = await fetch("/ui/api/session", { credentials: "same-origin", headers: csrf ? { "x-csrf-token": csrf } : {} });
  if (!r.ok) throw new Error("not signed in: sign in to the console first");
  return csrf;
}

async function main() {
  if (!/^sbx-[0-9a-f]{16}$/.test(id)) {
    show("no sandbox named: open this page from a sandbox's page in the console", "failed");
    return;
  }
  const term = new Terminal({ cursorBlink: true, convertEol: false, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById("term"));
  fit.fit();
  let csrf;
  try {
    csrf = await csrfToken();
  } catch (e) {
    show(e.message, "failed");
    return;
  }
  const q = new URLSearchParams({ cols: String(term.cols), rows: String(term.rows) });
  if (csrf) q.set("csrf", csrf);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/v1/sandboxes/${id}/pty?${q}`);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  let ended = false;
  ws.onopen = () => {
    show("connected");
    term.focus();
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") {
      term.write(new Uint8Array(ev.data));
      return;
    }
    let m;
    try {
      m = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    if (m.type === "exit") {
      ended = true;
      const how = m.signal != null ? `signal ${m.signal}` : `exit code ${m.code}`;
      show(`the shell ended (${how}); reload to open another`, "ended");
    } else if (m.type === "error") {
      ended = true;
      show(`${m.code}: ${m.message}`, "failed");
    }
  };
  ws.onclose = (ev) => {
    if (!ended) show(`disconnected (${ev.code}); reload to open another`, "failed");
  };
  term.onData((d) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(d));
  });
  term.onResize(({ cols, rows }) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols, rows }));
  });
  window.addEventListener("resize", () => fit.fit());
}

main();
