"""E2B's file calls mean on branchboxd what they mean on E2B's envd (issue 28, causes 3 to 6):
the pinned `e2b` package, configured only as an E2B user would, on real gVisor sandboxes."""

from __future__ import annotations

import time

import httpx
import pytest

from test_e2b_fixes import e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")

LIMIT = 30


@pytest.fixture
def esbx(e2b_env):  # noqa: F811
    s = e2b.Sandbox.create(timeout=300)
    yield s
    s.kill()


def test_remove_of_a_missing_path_succeeds_as_envds_does(esbx):
    esbx.files.remove("not_there.txt")
    esbx.files.remove("/tmp/no/such/dir")
    esbx.files.make_dir("gone/deep")
    esbx.files.write("gone/deep/f", "x")
    esbx.files.remove("gone")
    assert not esbx.files.exists("gone")
    # What may not be removed is still refused.
    with pytest.raises(e2b.SandboxException):
        esbx.files.remove("/etc/hostname")


def _events_until_marker(w, marker: str):
    """A polling watcher's events up to the creation of `marker`, which is left out."""
    seen = []
    deadline = time.monotonic() + LIMIT
    while not any(e.name == marker for e in seen):
        if time.monotonic() > deadline:
            pytest.fail(f"the marker's event did not come within {LIMIT} s: {seen}")
        seen.extend(w.get_new_events())
        time.sleep(0.1)
    return [(e.name, e.type) for e in seen if e.name != marker]


def test_a_write_gives_a_watcher_exactly_the_files_own_events(esbx):
    T = e2b.FilesystemEventType
    esbx.files.make_dir("w")
    w = esbx.files.watch_dir("w")
    try:
        esbx.files.write("w/new.txt", "first")
        esbx.commands.run("touch w/m1")
        assert _events_until_marker(w, "m1") == [("new.txt", T.CREATE), ("new.txt", T.WRITE)]
        esbx.files.write("w/new.txt", "second")
        esbx.commands.run("touch w/m2")
        assert _events_until_marker(w, "m2") == [("new.txt", T.WRITE)]
        # A command's own write shows as envd shows it: a write per write, no close.
        esbx.commands.run("printf hi > w/c.txt; touch w/m3")
        assert _events_until_marker(w, "m3") == [("c.txt", T.CREATE), ("c.txt", T.WRITE)]
    finally:
        w.stop()
    assert [e.name for e in esbx.files.list("w")] == ["c.txt", "m1", "m2", "m3", "new.txt"]


def test_get_info_of_a_symlink_gives_its_target_as_envd_does(esbx, e2b_env):  # noqa: F811
    esbx.files.make_dir("links/sub")
    esbx.files.write("links/sub/f.txt", "hello")
    esbx.commands.run("ln -s sub/f.txt to_file && ln -s sub to_dir && ln -s nowhere dangling && ln -s to_file twice",
                      cwd="/home/user/links")
    info = esbx.files.get_info("links/to_file")
    # e2b 2.63 shows a link as SYMLINK (envd marks it `is_symlink`); its target's path is given.
    assert (info.type, info.symlink_target) == (e2b.FileType.SYMLINK, "/home/user/links/sub/f.txt")
    assert info.mode == 0o644 and info.permissions.startswith("L")
    assert esbx.files.get_info("links/twice").symlink_target == "/home/user/links/sub/f.txt"
    assert esbx.files.get_info("links/to_dir").symlink_target == "/home/user/links/sub"
    assert esbx.files.get_info("links/dangling").symlink_target == "/home/user/links/dangling"
    assert esbx.files.get_info("links/sub/f.txt").symlink_target is None
    # On the wire the type is that of what the link leads to, as older SDKs read it.
    r = httpx.post(
        f"{e2b_env.url}/e2b/envd/filesystem.Filesystem/Stat",
        headers={"X-API-Key": e2b_env.token, "E2b-Sandbox-Id": esbx.sandbox_id},
        json={"path": "/home/user/links/to_dir"},
    )
    assert r.status_code == 200, r.text
    entry = r.json()["entry"]
    assert (entry["type"], entry["isSymlink"], entry["symlinkTarget"]) == (
        "FILE_TYPE_DIRECTORY", True, "/home/user/links/sub")
    listed = {e.name: e.symlink_target for e in esbx.files.list("links")}
    assert listed["to_file"] == "/home/user/links/sub/f.txt" and listed["sub"] is None


def test_a_deep_listing_gives_each_directory_then_what_it_holds(esbx):
    esbx.commands.run("mkdir -p t/a/x t/b && touch t/a/y t/a/x/deep t/b/z t/c t/0")
    got = [e.path.removeprefix("/home/user/t/") for e in esbx.files.list("t", depth=2)]
    assert got == ["0", "a", "a/x", "a/y", "b", "b/z", "c"]
    got = [e.path.removeprefix("/home/user/t/") for e in esbx.files.list("t", depth=3)]
    assert got == ["0", "a", "a/x", "a/x/deep", "a/y", "b", "b/z", "c"]
    assert [e.name for e in esbx.files.list("t")] == ["0", "a", "b", "c"]


def test_entries_name_their_owner_and_group_as_envds_do(esbx):
    esbx.files.write("mine.txt", "x")
    info = esbx.files.get_info("mine.txt")
    assert (info.owner, info.group) == ("user", "user")
    assert (esbx.files.get_info("/etc/passwd").owner, esbx.files.get_info("/etc").group) == ("root", "root")
    esbx.commands.run("touch /tmp/numbered && chown 4242:4343 /tmp/numbered", user="root")
    listed = {e.name: (e.owner, e.group) for e in esbx.files.list("/tmp")}
    assert listed["numbered"] == ("4242", "4343")
    assert {e.name: e.owner for e in esbx.files.list("/home/user")}["mine.txt"] == "user"
