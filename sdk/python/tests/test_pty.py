"""`sandbox.pty`: terminals over the service's WebSocket route, sync and async, in real gVisor
sandboxes. No timing is asserted; waits are bounded only so that a failure cannot hang."""

import asyncio
import time

import pytest

from conftest import wait_until

from branchbox import (AsyncSandbox, BranchboxError, CommandTimeoutException, ConflictError, InvalidArgumentError,
                       NotFoundError, PtySize, Sandbox)

LIMIT = 120


class Screen:
    """What a terminal printed, for `on_data`."""

    def __init__(self) -> None:
        self.data = b""

    def __call__(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.data += data

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def shows(self, needle: str) -> bool:
        return needle in self.text


def test_a_login_shell_as_the_default_user_sized_resized_and_typed_into(sbx):
    screen = Screen()
    h = sbx.pty.create(PtySize(rows=30, cols=100), on_data=screen)
    # `$(...)` markers: the typed line echoes `S=$(stty size)`, only its output reads `S=30 100`.
    sbx.pty.send_stdin(h.pid, b'echo "U=$(id -un):$PWD"; echo "S=$(stty size)"\n')
    wait_until(lambda: screen.shows("S=30 100"), "the first size", LIMIT)
    assert "U=user:/home/user" in screen.text, screen.text
    sbx.pty.resize(h.pid, PtySize(rows=40, cols=120))
    h.send_stdin('echo "S=$(stty size)"\n')
    wait_until(lambda: screen.shows("S=40 120"), "the new size", LIMIT)
    h.send_stdin("echo typed-in-the-terminal > typed.txt\n")
    wait_until(lambda: sbx.files.exists("typed.txt"), "the typed command's file", LIMIT)
    wait_until(lambda: sbx.files.read("typed.txt") == "typed-in-the-terminal\n", "the file's text", LIMIT)
    h.send_stdin("exit 3\n")
    r = h.wait(timeout=LIMIT)
    assert (r.exit_code, r.signal) == (3, None)
    assert h.exit_code == 3
    # Ended: it is no longer known by pid, and typing into it says so.
    assert sbx.pty.kill(h.pid) is False and h.kill() is False
    with pytest.raises(NotFoundError):
        sbx.pty.send_stdin(h.pid, b"x")
    with pytest.raises(BranchboxError) as e:
        h.send_stdin(b"x")
    assert e.value.code == "pty_closed"


def test_a_command_its_output_read_by_wait_or_iteration(sbx):
    h = sbx.pty.create(cmd="echo C=$((6 * 7)); cd; pwd; exit 4", cwd="/tmp", size=PtySize(24, 80))
    got = []
    r = h.wait(on_pty=got.append, timeout=LIMIT)
    out = b"".join(got).decode()
    assert "C=42" in out and "/home/user" in out, out
    assert r.exit_code == 4
    h = sbx.pty.create(cmd="pwd; id -un", cwd="/tmp", user="root")
    out = b"".join(pty for _, _, pty in h).decode()
    assert "/tmp\r\nroot\r\n" in out, out
    assert h.wait(timeout=LIMIT).exit_code == 0


def test_kill_ends_the_process_and_a_timeout_ends_it_too(sbx):
    running = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 424[2]' || true"
    h = sbx.pty.create(cmd="sleep 4242")
    wait_until(lambda: sbx.commands.run(running).stdout.strip() == "1", "the sleep", LIMIT)
    assert sbx.pty.kill(h.pid) is True
    r = h.wait(timeout=LIMIT)
    assert (r.exit_code, r.signal) == (None, 9)
    wait_until(lambda: sbx.commands.run(running).stdout.strip() == "0", "the sleep's end", LIMIT)
    assert h.kill() is False

    # E2B's `timeout`: the connection is closed after it, which ends the command.
    h = sbx.pty.create(cmd="sleep 4243", timeout=1, on_data=Screen())
    with pytest.raises(CommandTimeoutException):
        h.wait(timeout=LIMIT)


def test_refusals_are_typed(sbx, service):
    with pytest.raises(InvalidArgumentError) as e:
        sbx.pty.create(PtySize(rows=24, cols=0))
    assert e.value.status == 400
    with pytest.raises(InvalidArgumentError) as e:
        sbx.pty.create(PtySize(rows=1001, cols=80))
    assert e.value.status == 400
    with pytest.raises(InvalidArgumentError):
        sbx.pty.create(envs={"A": "1"})
    h = sbx.pty.create(cmd="sleep 4244", timeout=0)
    with pytest.raises(InvalidArgumentError):
        h.resize(PtySize(rows=0, cols=80))
    with pytest.raises(InvalidArgumentError):
        sbx.pty.resize(h.pid, PtySize(rows=24, cols=1001))
    assert h.kill() is True
    sbx.pause()
    with pytest.raises(ConflictError) as e:
        sbx.pty.create()
    assert e.value.status == 409
    sbx.kill()
    with pytest.raises(NotFoundError) as e:
        sbx.pty.create()
    assert e.value.status == 404


def test_a_token_from_the_data_directory_opens_a_terminal_once_the_service_proves_itself(sbx, service, monkeypatch):
    monkeypatch.setenv("BRANCHBOX_DATA", str(service.data_dir))
    monkeypatch.delenv("BRANCHBOX_URL", raising=False)
    monkeypatch.delenv("BRANCHBOX_TOKEN", raising=False)
    s = Sandbox.connect(sbx.sandbox_id)
    try:
        h = s.pty.create(cmd="echo via-the-data-dir")
        got = []
        assert h.wait(on_pty=got.append, timeout=LIMIT).exit_code == 0
        assert b"via-the-data-dir" in b"".join(got)
    finally:
        s.close()


def test_async_terminal(service):
    async def until(cond, what):
        deadline = time.monotonic() + LIMIT
        while not await cond():
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not happen within {LIMIT} s")
            await asyncio.sleep(0.2)

    async def main():
        s = await AsyncSandbox.create(timeout=600, **service.sdk())
        try:
            seen = bytearray()

            async def on_data(data: bytes) -> None:
                seen.extend(data)

            async def shows(needle):
                return needle in seen.decode("utf-8", "replace")

            h = await s.pty.create(PtySize(rows=30, cols=100), on_data=on_data)
            await s.pty.send_stdin(h.pid, b'echo "U=$(id -un):$PWD"; echo "S=$(stty size)"\n')
            await until(lambda: shows("S=30 100"), "the first size")
            assert "U=user:/home/user" in seen.decode(), seen
            await h.resize(PtySize(rows=50, cols=132))
            await h.send_stdin('echo "S=$(stty size)"; echo async-typed > typed.txt\n')
            await until(lambda: shows("S=50 132"), "the new size")

            async def written():
                return await s.files.exists("typed.txt") and await s.files.read("typed.txt") == "async-typed\n"

            await until(written, "the typed command's file")
            await h.send_stdin(b"exit 3\n")
            r = await asyncio.wait_for(h.wait(), LIMIT)
            assert (r.exit_code, r.signal) == (3, None)

            # A plain function as on_data, a command, and kill().
            out = []
            k = await s.pty.create(on_data=out.append, cmd="echo K=$((2 + 3)); sleep 4245")
            await until(lambda: asyncio.sleep(0, b"K=5" in b"".join(out)), "the command's output")
            assert await s.pty.kill(k.pid) is True
            r = await asyncio.wait_for(k.wait(), LIMIT)
            assert (r.exit_code, r.signal) == (None, 9)
            assert await k.kill() is False

            with pytest.raises(InvalidArgumentError):
                await s.pty.create(PtySize(rows=0, cols=0))
            await s.kill()
            with pytest.raises(NotFoundError):
                await s.pty.create()
        finally:
            await s.kill()
            await s.close()

    asyncio.run(main())
