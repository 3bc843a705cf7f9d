"""Recovery after branchboxd is killed mid-fork, gc through the service and the SDK, and the
one naming rule on both sides of the wire."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from branchbox import InvalidArgumentError, Sandbox, check_name

from conftest import _serve, procs_under, wait_until


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "/abs", "../../etc/passwd", "x\x00y", "two words", "n" * 129])
def test_the_sdk_refuses_what_the_rule_refuses_before_sending(service, bad):
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.delete_snapshot(bad, **service.sdk())
    assert "no such route" not in str(e.value) and e.value.status is None
    with pytest.raises(InvalidArgumentError, match="invalid snapshot name"):
        check_name("snapshot name", bad)


def test_an_id_is_a_reference_but_never_a_name():
    with pytest.raises(InvalidArgumentError, match="shape of an id"):
        check_name("ref name", "snap-0123456789abcdef")
    assert check_name("ref name", "snap-named") == "snap-named"


def test_the_service_refuses_bad_names_itself(service, sbx):
    with service.client() as c:
        r = c.post(f"/v1/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "a/b"})
        assert r.status_code == 422, r.text
        assert "invalid snapshot name" in r.json()["error"]["message"]
        r = c.get("/v1/snapshots/%2E%2E")
        assert r.status_code == 400, r.text
    with pytest.raises(InvalidArgumentError):
        sbx.create_snapshot("..")
    assert sbx.create_snapshot("v1.0-ok").name == "v1.0-ok"


def test_gc_reports_then_frees_a_fork_point_nothing_reaches(service):
    src = Sandbox.create(timeout=600, **service.sdk())
    kids = src.fork(1)
    kid = kids[0]
    assert isinstance(kid, Sandbox), kid
    fork_point = kid.get_info().parent_snapshot
    kid.kill()
    assert fork_point not in Sandbox.gc(dry_run=True, **service.sdk()).unreachable_fork_points
    src.kill()
    report = Sandbox.gc(dry_run=True, **service.sdk())
    assert report.dry_run and fork_point in report.unreachable_fork_points
    assert any(s.snapshot_id == fork_point for s in Sandbox.list_snapshots(**service.sdk()))
    done = Sandbox.gc(**service.sdk())
    assert not done.dry_run and fork_point in done.unreachable_fork_points and done.freed_bytes > 0
    assert not any(s.snapshot_id == fork_point for s in Sandbox.list_snapshots(**service.sdk()))


def test_a_service_killed_mid_fork_shows_or_reaps_every_child_after_restart(workdir):
    with _serve(workdir, "crash", "--max-sandboxes", "8") as svc:
        with svc.client() as c:
            src = c.post("/v1/sandboxes", json={}).json()["id"]
        boxes = svc.data_dir / "sandboxes"

        def started() -> int:
            return sum(1 for d in boxes.iterdir() if d.name != src and (d / "shim.pid").is_file())

        def fork() -> None:
            try:
                httpx.post(f"{svc.url}/v1/sandboxes/{src}/fork", json={"count": 5}, headers=svc.headers(), timeout=120)
            except httpx.TransportError:
                pass  # the service is killed under it

        t = threading.Thread(target=fork)
        t.start()
        deadline = time.monotonic() + 60
        while started() < 5 and time.monotonic() < deadline:
            time.sleep(0.002)
        assert started() >= 1, "no child started"
        svc.stop(signal.SIGKILL)
        t.join()
        children = {d.name for d in boxes.iterdir() if d.name != src}
        restarted = time.monotonic()
        svc.start()
        # Each child is probed for 2 s at most (a child restored but never thawed holds its
        # answers); the probe once waited the agent client's 60 s default instead.
        assert time.monotonic() - restarted < 45, "the restart waited past its probes' bound"
        with svc.client() as c:
            listed = {s["id"]: s for s in c.get("/v1/sandboxes").json()}
            audit = c.get("/v1/audit").json()
        for child in children:
            if child in listed:
                assert listed[child]["state"] == "running", listed[child]
            else:
                assert not (boxes / child).exists(), f"unlisted child {child} kept its directory"
                assert not [p for p in procs_under(boxes / child)], f"unlisted child {child} still runs"
        assert any(e["action"] == "service.reconcile" for e in audit), audit


def test_a_sandbox_whose_runtime_died_is_listed_lost_with_its_reason(service):
    with service.client() as c:
        sid = c.post("/v1/sandboxes", json={}).json()["id"]
        box = service.data_dir / "sandboxes" / sid
        for pid in procs_under(box):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        def lost():
            info = c.get(f"/v1/sandboxes/{sid}").json()
            return info if info["state"] == "lost" else None

        info = wait_until(lost, "the sandbox to be seen lost")
        assert isinstance(info["lost_reason"], str) and info["lost_reason"], info
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
