"""Sandbox lifecycle through the SDK: create, info, list with metadata, timeout, pause and
connect, kill, context manager, TTL expiry."""

import pytest

from branchbox import ConflictError, NotFoundError, Sandbox
from conftest import wait_until


def test_create_reports_running_with_metadata_and_creator(service):
    with Sandbox.create(timeout=120, metadata={"owner": "ada", "task": "t1"}, **service.sdk()) as s:
        info = s.get_info()
        assert info.sandbox_id == s.sandbox_id
        assert (info.state, info.backend, info.metadata) == ("running", "gvisor", {"owner": "ada", "task": "t1"})
        assert info.created_by and info.created_by.startswith("tok-")
        assert info.end_at is not None and info.end_at > info.started_at


def test_list_filters_by_metadata(service):
    a = Sandbox.create(metadata={"group": "g-list", "n": "1"}, **service.sdk())
    b = Sandbox.create(metadata={"group": "g-list", "n": "2"}, **service.sdk())
    try:
        both = {i.sandbox_id for i in Sandbox.list(metadata={"group": "g-list"})}
        assert both == {a.sandbox_id, b.sandbox_id}
        only_b = [i.sandbox_id for i in Sandbox.list(metadata={"group": "g-list", "n": "2"})]
        assert only_b == [b.sandbox_id]
        assert Sandbox.list(metadata={"group": "no-such-group"}) == []
    finally:
        a.kill()
        b.kill()


def test_context_manager_kills_on_exit(service):
    with Sandbox.create(**service.sdk()) as s:
        sid = s.sandbox_id
    with pytest.raises(NotFoundError):
        Sandbox.connect(sid)
    assert sid not in {i.sandbox_id for i in Sandbox.list()}


def test_pause_blocks_commands_and_connect_resumes_with_state(sbx):
    sbx.files.write("/root/kept.txt", "still here", user="root")
    assert sbx.pause().state == "paused"
    assert sbx.get_info().end_at is None
    with pytest.raises(ConflictError) as e:
        sbx.commands.run("true")
    assert e.value.status == 409 and "paused" in e.value.message
    again = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert again.get_info().state == "running"
    assert again.files.read("/root/kept.txt", user="root") == "still here"
    assert again.get_info().end_at is not None


def test_set_timeout_moves_the_expiry(sbx):
    before = sbx.get_info().end_at
    sbx.set_timeout(3000)
    after = sbx.get_info().end_at
    assert after is not None and before is not None and after > before


def test_timeout_kills_the_sandbox(service):
    s = Sandbox.create(timeout=1, **service.sdk())
    wait_until(lambda: s.sandbox_id not in {i.sandbox_id for i in Sandbox.list()}, "the timeout kill")
    assert not s.kill()
    with service.client() as c:
        actions = [e["action"] for e in c.get("/v1/audit", params={"sandbox": s.sandbox_id}).json()]
    assert "ttl.kill" in actions


def test_timeout_can_pause_instead(service):
    s = Sandbox.create(timeout=1, on_timeout="pause", **service.sdk())
    try:
        wait_until(lambda: s.get_info().state == "paused", "the timeout pause")
        assert Sandbox.connect(s.sandbox_id).commands.run("echo back").stdout == "back\n"
    finally:
        s.kill()


def test_kill_twice_reports_gone(service):
    s = Sandbox.create(**service.sdk())
    assert s.kill() is True
    assert s.kill() is False
    assert not s.is_running()
