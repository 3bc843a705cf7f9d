"""Fork, snapshots, checkpoints, rollback, lineage and the audit trail of them."""

import pytest

from branchbox import BranchboxError, ConflictError, NotFoundError, Sandbox


def test_fork_children_continue_from_the_parent_and_diverge(sbx):
    sbx.files.write("/home/user/state", "parent")
    kids = sbx.fork(count=2)
    try:
        assert all(isinstance(k, Sandbox) for k in kids), kids
        a, b = kids
        assert a.files.read("/home/user/state") == b.files.read("/home/user/state") == "parent"
        a.files.write("/home/user/state", "a")
        assert b.files.read("/home/user/state") == "parent"
        assert sbx.files.read("/home/user/state") == "parent"
        assert a.get_info().parent_snapshot == b.get_info().parent_snapshot is not None
    finally:
        for k in kids:
            if isinstance(k, Sandbox):
                k.kill()


def test_fork_keeps_running_processes(sbx):
    sbx.commands.run("python3 -c 'import time\nwhile True: time.sleep(1)'", background=True)
    (child,) = sbx.fork(count=1)
    try:
        assert isinstance(child, Sandbox)
        assert any(p.running for p in child.commands.list())
    finally:
        child.kill()


def test_fork_count_out_of_range_is_refused(sbx):
    with pytest.raises(BranchboxError) as e:
        sbx.fork(count=0)
    assert e.value.status == 422


def test_snapshot_restores_files_and_metadata_is_fresh(service, sbx):
    sbx.files.write("/home/user/snap.txt", "captured")
    snap = sbx.create_snapshot(name=f"snap-test-{sbx.sandbox_id[4:]}")
    assert snap.kind == "snapshot" and snap.source == sbx.sandbox_id
    sbx.files.write("/home/user/snap.txt", "later")
    with Sandbox.create(snapshot_id=snap.name, **service.sdk()) as r:
        assert r.files.read("/home/user/snap.txt") == "captured"
        assert r.get_info().parent_snapshot == snap.snapshot_id
    assert snap.snapshot_id in {s.snapshot_id for s in Sandbox.list_snapshots()}


def test_snapshot_name_taken_is_a_conflict(sbx):
    name = f"dup-{sbx.sandbox_id[4:]}"
    sbx.create_snapshot(name=name)
    with pytest.raises(ConflictError):
        sbx.create_snapshot(name=name)


def test_checkpoint_and_rollback_in_place(sbx):
    sbx.files.write("/home/user/doc", "v1")
    ck = sbx.checkpoint()
    assert ck.kind == "checkpoint"
    sbx.files.write("/home/user/doc", "v2")
    sbx.files.write("/home/user/new", "x")
    info = sbx.rollback(ck.snapshot_id)
    assert info.sandbox_id == sbx.sandbox_id and info.state == "running"
    assert sbx.files.read("/home/user/doc") == "v1"
    assert not sbx.files.exists("/home/user/new")
    assert ck.snapshot_id in {c.snapshot_id for c in sbx.checkpoints()}


def test_rollback_to_a_checkpoint_of_another_sandbox_is_refused(service, sbx):
    with Sandbox.create(**service.sdk()) as other:
        ck = other.checkpoint()
        with pytest.raises(ConflictError):
            sbx.rollback(ck.snapshot_id)


def test_lineage_links_parent_snapshot_and_children(sbx):
    kids = sbx.fork(count=1)
    try:
        (child,) = kids
        assert isinstance(child, Sandbox)
        lin = child.lineage()
        point = child.get_info().parent_snapshot
        assert lin.parent_of(child.sandbox_id) == point
        assert lin.parent_of(point) == sbx.sandbox_id
        assert {b["id"] for b in lin.sandboxes} >= {sbx.sandbox_id, child.sandbox_id}
    finally:
        for k in kids:
            if isinstance(k, Sandbox):
                k.kill()


def test_delete_snapshot_then_restore_is_not_found(service, sbx):
    snap = sbx.create_snapshot()
    Sandbox.delete_snapshot(snap.snapshot_id)
    with pytest.raises((NotFoundError, ConflictError)):
        Sandbox.create(snapshot_id=snap.snapshot_id, **service.sdk())


def test_audit_records_who_what_and_parent_of_a_fork(service, sbx):
    kids = sbx.fork(count=1)
    for k in kids:
        if isinstance(k, Sandbox):
            k.kill()
    with service.client() as c:
        log = c.get("/v1/audit", params={"sandbox": sbx.sandbox_id, "limit": 1000}).json()
    fork = [e for e in log if e["action"] == "POST /v1/sandboxes/{id}/fork"]
    assert fork and fork[-1]["status"] == 200
    assert fork[-1]["who"].startswith("tok-") and fork[-1]["parent"] == sbx.sandbox_id
    assert fork[-1]["snapshot"].startswith("snap-")
    created = [e for e in log if e["action"] == "POST /v1/sandboxes"]
    assert created and created[0]["who"] == fork[-1]["who"]


def test_step_history_makes_every_command_a_checkpoint(sbx):
    sbx.set_history(True)
    first = sbx.commands.run("echo 1 >> /home/user/steps")
    second = sbx.commands.run("echo 2 >> /home/user/steps")
    assert first.checkpoint and second.checkpoint and first.checkpoint != second.checkpoint
    sbx.set_history(False)
    assert sbx.commands.run("true").checkpoint is None
    sbx.rollback(first.checkpoint)
    assert sbx.files.read("/home/user/steps").split() == ["1"]
