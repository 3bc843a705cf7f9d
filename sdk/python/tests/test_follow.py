"""Following what goes on in a sandbox through the SDK, sync and async, against real sandboxes:
a background process's open stdin (`send_stdin`, `close_stdin`), its output from now on
(`commands.connect`, callbacks of background handles) and directory watches (`files.watch_dir`)."""

import asyncio
import time

import pytest

from branchbox import (AsyncSandbox, BranchboxError, CommandExitException, FilesystemEventType, InvalidArgumentError,
                       NotFoundError, Sandbox, TimeoutException)

from conftest import wait_until

#: Seconds any one wait of these tests may take before it fails instead of hanging.
LIMIT = 60

#: Echoes each line it reads, then "bye" at end of file.
ECHO_LOOP = 'while IFS= read -r l; do echo "got:$l"; done; echo bye'


@pytest.fixture(scope="module")
def box(service):
    """One sandbox for the sync tests of this file."""
    s = Sandbox.create(timeout=600, **service.sdk())
    yield s
    s.kill()
    s.close()


def test_stdin_feeds_a_background_process_until_closed(box):
    h = box.commands.run(ECHO_LOOP, background=True, stdin=True)
    h.send_stdin("a\n")
    box.commands.send_stdin(h.pid, b"b \xc3\xa9\n")      # bytes go as they are
    h.close_stdin()
    r = h.wait(timeout=LIMIT)
    assert (r.stdout, r.exit_code) == ("got:a\ngot:b é\nbye\n", 0)

    # A text as stdin is written first, and the stdin stays open.
    h = box.commands.run(ECHO_LOOP, background=True, stdin="first\n")
    box.commands.send_stdin(h.pid, "second\n")
    box.commands.close_stdin(h.pid)
    assert h.wait(timeout=LIMIT).stdout == "got:first\ngot:second\nbye\n"


def test_stdin_refused_without_it_or_once_closed(box):
    h = box.commands.run("sleep 600", background=True)
    try:
        with pytest.raises(InvalidArgumentError) as e:
            box.commands.send_stdin(h.pid, "x\n")
        assert e.value.code == "invalid_input"
        with pytest.raises(InvalidArgumentError):
            h.close_stdin()
    finally:
        h.kill()
    h = box.commands.run("read x; sleep 600", background=True, stdin=True)
    try:
        h.close_stdin()
        with pytest.raises(InvalidArgumentError):
            h.send_stdin("late\n")
    finally:
        h.kill()
    with pytest.raises(NotFoundError):
        box.commands.send_stdin(999_999, "x")


def test_background_callbacks_stream_its_output(box):
    out, err = [], []
    h = box.commands.run(ECHO_LOOP + "; echo oops >&2", background=True, stdin=True,
                         on_stdout=out.append, on_stderr=err.append)
    h.send_stdin("one\n")
    wait_until(lambda: "got:one\n" in "".join(out), "the first line's echo", LIMIT)
    h.close_stdin()
    r = h.wait(timeout=LIMIT)
    assert "".join(out) == r.stdout == "got:one\nbye\n"
    assert "".join(err) == r.stderr == "oops\n"


def test_connect_follows_later_output_and_exit(box):
    h = box.commands.run('echo before; read x; echo "after:$x"; echo gone >&2; exit 3', background=True, stdin=True)
    wait_until(lambda: any(p.pid == h.pid and p.running for p in box.commands.list()), "the process", LIMIT)
    streamed = []
    c = box.commands.connect(h.pid, on_stdout=streamed.append, timeout=LIMIT)
    box.commands.send_stdin(h.pid, "go\n")
    late = []
    with pytest.raises(CommandExitException) as e:
        c.wait(timeout=LIMIT, on_stderr=late.append)   # a callback given to wait gets all since connect
    assert e.value.exit_code == 3
    assert e.value.stdout.endswith("after:go\n")      # "before" too when the agent had not yet passed it on
    assert "".join(streamed) == e.value.stdout
    assert "".join(late) == e.value.stderr == "gone\n"
    # The starter's handle still gets the whole result.
    with pytest.raises(CommandExitException) as e:
        h.wait(timeout=LIMIT)
    assert e.value.stdout == "before\nafter:go\n"

    # A zero exit returns the result.
    h = box.commands.run('read x; echo "ok:$x"', background=True, stdin=True)
    c = box.commands.connect(h.pid, timeout=LIMIT)
    h.send_stdin("fine\n")
    r = c.wait(timeout=LIMIT)
    assert (r.stdout, r.exit_code) == ("ok:fine\n", 0)
    h.wait(timeout=LIMIT)


def test_connect_to_a_missing_process(box):
    with pytest.raises(NotFoundError):
        box.commands.connect(999_999)


def test_connect_timeout_and_disconnect_leave_the_process_running(box):
    h = box.commands.run("sleep 600", background=True)
    try:
        c = box.commands.connect(h.pid, timeout=0.5)     # following ends at its timeout
        with pytest.raises(TimeoutException):
            c.wait(timeout=LIMIT)
        d = box.commands.connect(h.pid, timeout=0)
        d.disconnect()
        with pytest.raises(BranchboxError) as e:
            d.wait(timeout=LIMIT)
        assert e.value.code == "disconnected"
        assert any(p.pid == h.pid and p.running for p in box.commands.list())
    finally:
        h.kill()


def _events_until(w, cond, what):
    """Collects a watch's events until `cond(events)` holds."""
    seen = []
    deadline = time.monotonic() + LIMIT
    while not cond(seen):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {LIMIT} s: {seen}")
        seen.extend(w.get_new_events())
        time.sleep(0.2)
    return seen


def test_watch_dir_sees_files_made_removed_and_stops(box):
    box.files.make_dir("w")
    w = box.files.watch_dir("w")
    try:
        box.commands.run("echo hi > w/f.txt; echo more >> w/f.txt; rm w/f.txt")
        seen = _events_until(w, lambda s: any(e.type == FilesystemEventType.REMOVE and e.name == "f.txt" for e in s),
                             "the removal")
        mine = [e for e in seen if e.name == "f.txt"]
        kinds = {e.type for e in mine}
        assert {FilesystemEventType.CREATE, FilesystemEventType.WRITE, FilesystemEventType.REMOVE} <= kinds, seen
        assert all(e.path == "/home/user/w/f.txt" for e in mine)
        assert FilesystemEventType.WRITE.value == "write"
    finally:
        w.stop()
    assert not w.running
    with pytest.raises(BranchboxError):
        w.get_new_events()


def test_recursive_watch_sees_a_subdirectory(box):
    box.files.make_dir("r/sub")
    with box.files.watch_dir("/home/user/r", recursive=True) as w:
        box.commands.run("echo x > r/sub/g.txt")
        seen = _events_until(w, lambda s: any(e.name == "sub/g.txt" for e in s), "the subdirectory's file")
        assert any(e.path == "/home/user/r/sub/g.txt" for e in seen)
    assert not w.running


def test_watch_of_a_file_or_nothing_raises(box):
    box.files.write("plain.txt", "x")
    with pytest.raises(InvalidArgumentError):
        box.files.watch_dir("plain.txt")
    with pytest.raises(NotFoundError):
        box.files.watch_dir("/no/such/dir")


def test_async_follow(service):
    async def until(cond, what):
        deadline = time.monotonic() + LIMIT
        while not await cond():
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not happen within {LIMIT} s")
            await asyncio.sleep(0.2)

    async def main():
        s = await AsyncSandbox.create(timeout=600, **service.sdk())
        try:
            # stdin, with an async callback that sees the output as it comes
            out = []

            async def on_stdout(text):
                out.append(text)

            h = await s.commands.run(ECHO_LOOP, background=True, stdin=True, on_stdout=on_stdout)
            await h.send_stdin("a\n")
            await until(lambda: asyncio.sleep(0, "got:a\n" in "".join(out)), "the echo")
            await s.commands.send_stdin(h.pid, b"b\n")
            await h.close_stdin()
            r = await h.wait(timeout=LIMIT)
            assert r.stdout == "".join(out) == "got:a\ngot:b\nbye\n"

            bare = await s.commands.run("sleep 600", background=True)
            with pytest.raises(InvalidArgumentError):
                await s.commands.send_stdin(bare.pid, "x")
            await bare.kill()

            # connect
            h = await s.commands.run('read x; echo "after:$x"; exit 5', background=True, stdin=True)
            got = []
            c = await s.commands.connect(h.pid, on_stdout=got.append, timeout=LIMIT)
            await h.send_stdin("go\n")
            with pytest.raises(CommandExitException) as e:
                await c.wait(timeout=LIMIT)
            assert (e.value.exit_code, e.value.stdout, "".join(got)) == (5, "after:go\n", "after:go\n")
            with pytest.raises(CommandExitException):
                await h.wait(timeout=LIMIT)
            with pytest.raises(NotFoundError):
                await s.commands.connect(999_999)

            # watch_dir
            await s.files.make_dir("aw")
            events, exits = [], []

            async def on_event(e):
                events.append(e)

            w = await s.files.watch_dir("aw", on_event, on_exit=exits.append, recursive=True, timeout=0)

            await s.commands.run("mkdir aw/sub && echo hi > aw/sub/f.txt && rm aw/sub/f.txt")
            await until(lambda: asyncio.sleep(0, any(e.name == "sub/f.txt" and e.type == FilesystemEventType.REMOVE
                                                     for e in events)), "the removal")
            kinds = {e.type for e in events if e.name == "sub/f.txt"}
            assert {FilesystemEventType.CREATE, FilesystemEventType.REMOVE} <= kinds, events
            await asyncio.wait_for(w.stop(), LIMIT)
            assert not w.running and exits == [None]
            with pytest.raises(InvalidArgumentError):
                await s.files.watch_dir("/etc/hostname", on_event)
        finally:
            await s.kill()
            await s.close()

    asyncio.run(main())
