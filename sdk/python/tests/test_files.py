"""Files through the SDK: text and binary round trips (streamed), listing, stat, exists,
rename, mkdir, remove, and the errors for missing paths and directories."""

import io
import os

import pytest

from branchbox import InvalidArgumentError, NotFoundError


def test_text_round_trip_creates_parents(sbx):
    info = sbx.files.write("/home/user/a/b/c.txt", "hello ✓")
    assert info.size == len("hello ✓".encode())
    assert sbx.files.read("/home/user/a/b/c.txt") == "hello ✓"


def test_binary_round_trip_across_many_chunks(sbx):
    data = os.urandom(3 * 1024 * 1024 + 17)
    sbx.files.write("/tmp/blob.bin", io.BytesIO(data))
    assert sbx.files.read("/tmp/blob.bin", format="bytes") == data
    assert sbx.commands.run("wc -c < /tmp/blob.bin").stdout.strip() == str(len(data))


def test_mode_is_applied(sbx):
    sbx.files.write("/home/user/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sbx.files.get_info("/home/user/run.sh").mode & 0o777 == 0o755
    assert sbx.commands.run("/home/user/run.sh").stdout == "ran\n"


def test_list_stat_exists(sbx):
    # As root: /srv is root's, and the calls act as the account they are made for.
    sbx.files.write("/srv/d/one", "1", user="root")
    sbx.files.write("/srv/d/two", "22", user="root")
    entries = {e.name: e for e in sbx.files.list("/srv/d")}
    assert set(entries) == {"one", "two"}
    assert entries["two"].size == 2 and entries["two"].type == "file" and entries["two"].path == "/srv/d/two"
    assert sbx.files.get_info("/srv/d").type == "dir"
    assert sbx.files.exists("/srv/d/one") and not sbx.files.exists("/srv/d/three")


def test_rename_make_dir_remove(sbx):
    assert sbx.files.make_dir("/tmp/work/x/y") is True
    assert sbx.files.make_dir("/tmp/work/x/y") is False
    sbx.files.write("/tmp/work/x/y/f", "data")
    moved = sbx.files.rename("/tmp/work/x/y/f", "/tmp/work/x/g")
    assert moved.path == "/tmp/work/x/g" and not sbx.files.exists("/tmp/work/x/y/f")
    sbx.files.remove("/tmp/work/x")
    assert not sbx.files.exists("/tmp/work/x")


def test_missing_file_and_directory_reads_are_typed_errors(sbx):
    with pytest.raises(NotFoundError) as e:
        sbx.files.read("/no/such/file")
    assert e.value.code == "path_not_found"
    with pytest.raises(InvalidArgumentError) as e:
        sbx.files.read("/etc")
    assert e.value.status == 422
    # A relative path is under the user's home, as in E2B.
    with pytest.raises(NotFoundError) as e:
        sbx.files.read("relative/path")
    assert "/home/user/relative/path" in e.value.message
