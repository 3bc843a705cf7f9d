"""E2B's snapshot and fork calls on branchbox's own snapshots, fork points and lineage (issue
28): the pinned `e2b` package, configured only as an E2B user would, on real gVisor sandboxes."""

from __future__ import annotations

import uuid

import pytest

from test_e2b_fixes import _end_ms, e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")


@pytest.fixture
def esbx(e2b_env):  # noqa: F811
    s = e2b.Sandbox.create(timeout=300)
    yield s
    s.kill()


def test_snapshot_create_list_restore_and_delete(esbx, e2b_env):  # noqa: F811
    esbx.files.write("/home/user/kept.txt", "before the snapshot")
    esbx.commands.run("sleep 600 >/dev/null 2>&1 &")
    name = f"e2b-snap-{uuid.uuid4().hex[:8]}"
    snap = esbx.create_snapshot(name=name)
    assert snap.snapshot_id.startswith("snap-") and snap.names == [name]
    esbx.files.write("/home/user/kept.txt", "after the snapshot")
    mine = [s.snapshot_id for s in e2b.Sandbox.list_snapshots(sandbox_id=esbx.sandbox_id).next_items()]
    assert mine == [snap.snapshot_id]
    assert [s.snapshot_id for s in e2b.Sandbox.list_snapshots(name=name).next_items()] == [snap.snapshot_id]
    assert e2b.Sandbox.list_snapshots(name=name + "-none").next_items() == []
    assert snap.snapshot_id in {s.snapshot_id for s in e2b.Sandbox.list_snapshots().next_items()}
    # Restored by id and by name: the files and the processes of the moment it was taken.
    for ref in (snap.snapshot_id, name):
        r = e2b.Sandbox.create(ref, timeout=120)
        try:
            assert r.files.read("/home/user/kept.txt") == "before the snapshot"
            assert "sleep 600" in r.commands.run("ps -eo args").stdout
            r.files.write("/home/user/kept.txt", "changed in the copy")
            assert esbx.files.read("/home/user/kept.txt") == "after the snapshot"
        finally:
            r.kill()
    with pytest.raises(e2b.SandboxException):
        esbx.create_snapshot(mode="filesystem")
    assert e2b.Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert e2b.Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert e2b.Sandbox.list_snapshots(sandbox_id=esbx.sandbox_id).next_items() == []
    with pytest.raises(e2b.SandboxException):
        e2b.Sandbox.create(snap.snapshot_id)


def test_fork_of_three_gives_three_running_copies_of_the_source(esbx, e2b_env):  # noqa: F811
    esbx.files.write("/home/user/state.txt", "before the fork")
    esbx.commands.run("sleep 600 >/dev/null 2>&1 &")
    forks = esbx.fork(count=3, timeout=90)
    assert len(forks) == 3 and all(isinstance(f, e2b.Sandbox) for f in forks), forks
    try:
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 3 and esbx.sandbox_id not in ids
        assert esbx.is_running()
        for i, f in enumerate(forks):
            assert f.is_running()
            assert f.files.read("/home/user/state.txt") == "before the fork"
            assert "sleep 600" in f.commands.run("ps -eo args").stdout
            f.files.write("/home/user/state.txt", f"fork {i}")
            # `timeout` is each fork's own.
            assert _end_ms(e2b_env, f.sandbox_id) <= _end_ms(e2b_env, esbx.sandbox_id)
        assert [f.files.read("/home/user/state.txt") for f in forks] == ["fork 0", "fork 1", "fork 2"]
        assert esbx.files.read("/home/user/state.txt") == "before the fork"
        by_id = e2b.Sandbox.fork(esbx.sandbox_id)
        assert len(by_id) == 1 and by_id[0].commands.run("echo hi").stdout == "hi\n"
        by_id[0].kill()
    finally:
        for f in forks:
            if isinstance(f, e2b.Sandbox):
                f.kill()
    gone = e2b.Sandbox.create(timeout=60)
    gone.kill()
    with pytest.raises(e2b.NotFoundException):
        gone.fork()
