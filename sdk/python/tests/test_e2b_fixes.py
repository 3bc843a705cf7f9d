"""Where branchboxd and the branchbox SDK meant something else than E2B by the same call (issue
28): E2B's own SDK (the pinned `e2b` package) on branchboxd's E2B wire API, configured only as
an E2B user would, and branchbox's SDK where its E2B-shaped calls differed. Real gVisor
sandboxes."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from branchbox import AsyncSandbox, CommandExitException, Sandbox
from conftest import wait_until

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")


@pytest.fixture
def e2b_env(service, monkeypatch):
    """Only what an E2B user sets (E2B_VALIDATE_API_KEY=false: e2b 2.40 to 2.46 refuse a key
    not shaped like E2B's before sending anything)."""
    for k in list(os.environ):
        if k.startswith(("BRANCHBOX_", "E2B_")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{service.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{service.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", service.token)
    monkeypatch.setenv("E2B_VALIDATE_API_KEY", "false")
    return service


def _end_ms(service, sandbox_id: str) -> int:
    with service.client() as c:
        r = c.get(f"/v1/sandboxes/{sandbox_id}")
        assert r.status_code == 200, r.text
        return r.json()["expires_ms"]


def test_connect_extends_a_sandboxs_end_and_never_shortens_it(e2b_env):
    sbx = e2b.Sandbox.create(timeout=3600)
    try:
        end = _end_ms(e2b_env, sbx.sandbox_id)
        # e2b up to 2.46 (2.45.1 in issue 28) send their default 300 s on every connect.
        again = e2b.Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert again.commands.run("echo hi").stdout == "hi\n"
        assert _end_ms(e2b_env, sbx.sandbox_id) >= end, "connect cut the sandbox's time short"
        e2b.Sandbox.connect(sbx.sandbox_id, timeout=7200)
        assert _end_ms(e2b_env, sbx.sandbox_id) >= end + 3000 * 1000, "a longer timeout did not extend it"
    finally:
        sbx.kill()


def test_ids_of_another_shape_are_not_found_so_kill_answers_false(e2b_env):
    for bad in ("x", "not-a-sandbox", "sbx-"):
        assert e2b.Sandbox.kill(bad) is False
        with pytest.raises(e2b.NotFoundException):
            e2b.Sandbox.get_info(bad)
        with pytest.raises(e2b.NotFoundException):
            e2b.Sandbox.set_timeout(bad, 60)
    with e2b_env.client() as c:
        r = c.post("/e2b/sandboxes/x/connect", json={"timeout": 60}, headers={"X-API-Key": e2b_env.token})
        assert r.status_code == 404 and r.json()["code"] == 404, r.text


def test_set_timeout_zero_ends_the_sandbox_now_as_on_e2bs_server(e2b_env):
    sbx = e2b.Sandbox.create(timeout=600)
    try:
        sbx.set_timeout(0)

        def gone():
            with e2b_env.client() as c:
                return c.get(f"/v1/sandboxes/{sbx.sandbox_id}").status_code == 404

        wait_until(gone, "the sandbox to end at its zero timeout", 60)
    finally:
        e2b.Sandbox.kill(sbx.sandbox_id)


def test_branchbox_command_timeout_zero_means_no_limit(sbx):
    r = sbx.commands.run("sleep 1; echo done", timeout=0)
    assert (r.exit_code, r.stdout) == (0, "done\n")
    seen = []
    r = sbx.commands.run("cat; echo ok >&2", timeout=0, stdin="fed\n", on_stdout=seen.append)
    assert (r.stdout, r.stderr, "".join(seen)) == ("fed\n", "ok\n", "fed\n")
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("exit 4", timeout=0)
    assert e.value.exit_code == 4
    h = sbx.commands.run("sleep 1; echo bg", background=True, timeout=0)
    assert h.wait(timeout=30).stdout == "bg\n"


def test_branchbox_is_running_takes_e2bs_request_timeout_and_answers_false_after_kill(service):
    sbx = Sandbox.create(timeout=120, **service.sdk())
    assert sbx.is_running(request_timeout=5) is True
    assert sbx.kill() is True
    assert sbx.is_running(request_timeout=5) is False

    async def run_async():
        s = await AsyncSandbox.create(timeout=120, **service.sdk())
        assert await s.is_running(request_timeout=5) is True
        assert await s.kill() is True
        assert await s.is_running(request_timeout=5) is False

    asyncio.run(run_async())


def test_refresh_extends_and_never_shortens_as_on_e2bs_server(e2b_env):
    sbx = e2b.Sandbox.create(timeout=3600)
    try:
        end = _end_ms(e2b_env, sbx.sandbox_id)
        with e2b_env.client() as c:
            r = c.post(f"/e2b/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 60},
                       headers={"X-API-Key": e2b_env.token})
            assert r.status_code == 204, r.text
        assert _end_ms(e2b_env, sbx.sandbox_id) >= end, "a refresh cut the sandbox's time short"
    finally:
        sbx.kill()


KILLED = "sandbox was killed or reached its end of life"


def test_a_command_whose_sandbox_is_killed_ends_saying_so(e2b_env):
    sbx = e2b.Sandbox.create(timeout=300)
    cmd = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(e2b.SandboxException) as e:
        cmd.wait()
    assert KILLED in str(e.value), e.value
    assert sbx.is_running() is False

    async def run_async():
        s = await e2b.AsyncSandbox.create(timeout=300)
        c = await s.commands.run("sleep 60", background=True)
        await s.kill()
        with pytest.raises(e2b.SandboxException) as e:
            await c.wait()
        assert KILLED in str(e.value), e.value

    asyncio.run(run_async())


def test_listing_serves_template_started_after_order_and_pages(e2b_env):
    import datetime
    import uuid

    tag = {"suite": uuid.uuid4().hex}
    made = []
    try:
        for _ in range(3):
            made.append(e2b.Sandbox.create(timeout=300, metadata=tag))
            time.sleep(0.01)
        ids = [s.sandbox_id for s in made]

        def listed(limit=100, order=None, **query):
            pages, p = [], e2b.Sandbox.list(query=e2b.SandboxQuery(metadata=tag, **query), limit=limit,
                                            order=order)
            while p.has_next:
                pages.append([i.sandbox_id for i in p.next_items()])
            return pages

        assert listed() == [ids[::-1]]
        assert listed(order="desc") == [ids[::-1]]
        assert listed(limit=2, order="desc") == [ids[:0:-1], ids[:1]]
        assert listed(limit=2, order="asc") == [ids[:2], ids[2:]]
        assert listed(template="base", order="asc") == [ids]
        assert listed(template="no-such-template") == [[]]
        third = made[2].get_info().started_at
        assert listed(started_after=third) == [ids[2:]]
        assert listed(started_after=third + datetime.timedelta(seconds=5)) == [[]]
        with e2b_env.client() as c:
            h = {"X-API-Key": e2b_env.token}
            for bad in ({"order": "sideways"}, {"startedAfter": "yesterday"}, {"limit": "0"},
                        {"nextToken": "forged"}, {"teamID": "t"}):
                r = c.get("/e2b/v2/sandboxes", params=bad, headers=h)
                assert r.status_code == 400 and r.json()["code"] == 400, (bad, r.text)
    finally:
        for s in made:
            s.kill()


def test_a_listing_without_order_pages_newest_first_across_states(e2b_env):
    """E2B's server lists newest first unless `order` says otherwise, whatever the states asked
    for; E2B's own suite pages with limit=1 and expects the sandbox made last on the first page."""
    import uuid

    tag = {"suite": uuid.uuid4().hex}
    older = e2b.Sandbox.create(timeout=300, metadata=tag)
    newer = e2b.Sandbox.create(timeout=300, metadata=tag)
    try:
        newer.beta_pause()
        for state in ([e2b.SandboxState.RUNNING, e2b.SandboxState.PAUSED], None):
            p = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata=tag, state=state), limit=1)
            first = p.next_items()
            assert [i.sandbox_id for i in first] == [newer.sandbox_id]
            assert first[0].state == e2b.SandboxState.PAUSED and p.has_next
            second = p.next_items()
            assert [(i.sandbox_id, i.state) for i in second] == [(older.sandbox_id, e2b.SandboxState.RUNNING)]
            assert not p.has_next
    finally:
        older.kill()
        newer.kill()


def test_template_exists_answers_true_for_base_as_create_takes_it(e2b_env):
    """`Template.exists("base")`: E2B's public template, which create and the template list take
    as the default image here, exists; a name no template has does not."""
    import uuid

    assert e2b.Template.exists("base") is True
    assert e2b.Template.exists(f"no-such-{uuid.uuid4().hex[:12]}") is False


def test_a_pause_without_memory_is_refused_and_a_strict_pause_pauses(e2b_env):
    sbx = e2b.Sandbox.create(timeout=300)
    try:
        for refused in (lambda: sbx.pause(keep_memory=False), lambda: sbx.pause(mode="filesystem")):
            with pytest.raises(e2b.SandboxException) as e:
                refused()
            assert "memory" in str(e.value)
        assert sbx.commands.run("echo still").stdout == "still\n"
        with e2b_env.client() as c:
            r = c.post("/e2b/v2/sandboxes", json={"autoPause": True, "autoPauseMemory": False},
                       headers={"X-API-Key": e2b_env.token})
            assert r.status_code == 400 and "autoPauseMemory" in r.json()["message"], r.text
            r = c.post("/e2b/v2/sandboxes", json={"autoPause": True, "autoResume": {"enabled": True}},
                       headers={"X-API-Key": e2b_env.token})
            assert r.status_code == 400 and "autoResume" in r.json()["message"], r.text
        sbx.pause(strict=True)
        assert e2b.Sandbox.get_info(sbx.sandbox_id).state == e2b.SandboxState.PAUSED
        again = e2b.Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("echo back").stdout == "back\n"
    finally:
        e2b.Sandbox.kill(sbx.sandbox_id)


def test_audit_lines_of_e2b_calls_name_the_caller_as_v1_ones_do(e2b_env):
    sbx = e2b.Sandbox.create(timeout=300)
    sbx.files.write("audited.txt", "x")
    sbx.set_timeout(600)
    sbx.kill()
    with e2b_env.client() as c:
        log = c.get("/v1/audit", params={"sandbox": sbx.sandbox_id, "limit": 1000}).json()
        mine = c.get("/v1/audit", params={"limit": 1000}).json()
    who = {e["action"]: e["who"] for e in log}
    for action in ("POST /e2b/v2/sandboxes", "POST /e2b/envd/files", "POST /e2b/sandboxes/{id}/timeout",
                   "DELETE /e2b/sandboxes/{id}"):
        assert who.get(action, "").startswith("tok-"), (action, log)
    v1 = [e["who"] for e in mine if e["action"].startswith("POST /v1/")]
    assert v1 and who["DELETE /e2b/sandboxes/{id}"] == v1[-1]


def test_v1_timeout_zero_ends_the_sandbox_now_as_e2bs_does(service):
    killed = Sandbox.create(timeout=600, **service.sdk())
    paused = Sandbox.create(timeout=600, on_timeout="pause", **service.sdk())
    try:
        with service.client() as c:
            r = c.post(f"/v1/sandboxes/{killed.sandbox_id}/timeout", json={"timeout": -1})
            assert r.status_code == 422, r.text
        killed.set_timeout(0)
        paused.set_timeout(0)

        def state(s):
            with service.client() as c:
                r = c.get(f"/v1/sandboxes/{s.sandbox_id}")
                return r.json()["state"] if r.status_code == 200 else "gone"

        wait_until(lambda: state(killed) == "gone", "the sandbox to end at its zero timeout", 60)
        wait_until(lambda: state(paused) == "paused", "the pausing sandbox to pause at its zero timeout", 60)
    finally:
        killed.kill()
        paused.kill()


def test_sudo_as_user_runs_as_root_as_on_e2b(e2b_env):
    sbx = e2b.Sandbox.create(timeout=300)
    try:
        run = sbx.commands.run
        assert run("sudo -n true").exit_code == 0
        assert run("sudo whoami").stdout == "root\n"
        assert run("sudo -n -u root id -u").stdout == "0\n"
        assert run("echo fed | sudo cat").stdout == "fed\n"
        assert run("sudo pwd", cwd="/tmp").stdout == "/tmp\n"
        assert run("sudo sh -c 'echo $SUDO_USER $HOME'").stdout == "user /root\n"
        run("sudo touch /etc/made-by-sudo")
        assert sbx.files.get_info("/etc/made-by-sudo").owner == "root"
        with pytest.raises(e2b.CommandExitException) as e:
            run("sudo sh -c 'echo out; echo err >&2; exit 3'")
        assert (e.value.exit_code, e.value.stdout, e.value.stderr) == (3, "out\n", "err\n")
        # An account the image's sudoers do not name is refused, as sudo refuses it.
        with pytest.raises(e2b.CommandExitException) as e:
            run("sudo -n true", user="nobody", cwd="/tmp")
        assert "may not run commands as root" in e.value.stderr
        # The root command ends with its sudo.
        h = run("sudo sleep 777", background=True)
        wait_until(lambda: "sleep 777" in run("ps -eo args", user="root").stdout, "the root sleep to start", 30)
        h.kill()
        wait_until(lambda: "sleep 777" not in run("ps -eo args", user="root").stdout,
                   "the root sleep to end with its sudo", 30)
    finally:
        sbx.kill()
