"""E2B's Python SDK surface on ours: `Sandbox()` creates, `api_key=`, the `user` account and its
home, files.write infos and lists, streamed reads, TimeoutException, get_info/get_metrics,
the list paginator, class-level kill, `template="base"`. Real gVisor sandboxes."""

import asyncio

import pytest

from branchbox import (
    AsyncSandbox,
    AuthenticationError,
    CommandExitException,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    Templates,
    TimeoutException,
)


@pytest.fixture
def e2b_env(service, monkeypatch):
    """Only what an E2B user sets: the key (as E2B_API_KEY) and where the service is."""
    monkeypatch.delenv("BRANCHBOX_TOKEN", raising=False)
    monkeypatch.setenv("BRANCHBOX_URL", service.url)
    monkeypatch.setenv("E2B_API_KEY", service.token)
    # No data-directory token to fall back on.
    monkeypatch.setenv("BRANCHBOX_DATA", "/nonexistent-branchbox-data")
    return service


def test_sandbox_constructor_creates_and_api_key_and_e2b_env_authenticate(e2b_env):
    sbx = Sandbox()
    try:
        assert sbx.is_running()
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list()]
    finally:
        sbx.kill()
    with Sandbox(api_key=e2b_env.token, timeout=120) as s2:
        assert s2.commands.run("echo ok").stdout == "ok\n"
    with pytest.raises(AuthenticationError):
        Sandbox(api_key="not-the-token")
    with pytest.raises(InvalidArgumentError):
        Sandbox.create(api_key="a", token="b")


def test_commands_run_as_user_in_its_home_with_sudo_and_root_on_request(sbx):
    r = sbx.commands.run('id -un; pwd; echo "$HOME"')
    assert r.stdout == "user\n/home/user\n/home/user\n"
    # Passwordless sudo is configured (it runs on a real kernel; gVisor always sets
    # no_new_privs, so setuid programs cannot raise privileges there: user="root" does).
    assert "user ALL=(ALL:ALL) NOPASSWD: ALL" in sbx.files.read("/etc/sudoers.d/user", user="root")
    assert sbx.commands.run("visudo -cf /etc/sudoers.d/user", user="root").exit_code == 0
    assert sbx.commands.run("id -un; pwd", user="root").stdout == "root\n/root\n"
    with pytest.raises(NotFoundError) as e:
        sbx.commands.run("true", user="nobody-here")
    assert "nobody-here" in str(e.value)


def test_files_are_owned_by_the_user_and_relative_paths_are_under_its_home(sbx):
    info = sbx.files.write("notes/a.txt", "hello")
    assert (info.path, info.name, info.type, info.size) == ("/home/user/notes/a.txt", "a.txt", "file", 5)
    # Made by the user, so the user's commands can change it and its new directory.
    sbx.commands.run("echo more >> notes/a.txt && touch notes/b")
    assert sbx.files.read("/home/user/notes/a.txt") == "hello" + "more\n"
    assert sbx.commands.run("stat -c %U notes notes/a.txt").stdout == "user\nuser\n"
    assert sbx.files.make_dir("made/here")
    assert sbx.commands.run("stat -c %U made/here", user="root", cwd="/home/user").stdout == "user\n"
    root_info = sbx.files.write("/root/r.txt", "r", user="root")
    assert root_info.path == "/root/r.txt"
    assert sbx.commands.run("stat -c %U /root/r.txt", user="root").stdout == "root\n"


def test_files_write_takes_a_list_and_returns_a_list(sbx):
    out = sbx.files.write([{"path": "/tmp/x/a", "data": "A"}, {"path": "b.bin", "data": b"\x00\x01"}])
    assert [(i.path, i.name, i.type) for i in out] == [("/tmp/x/a", "a", "file"), ("/home/user/b.bin", "b.bin", "file")]
    assert sbx.files.read("b.bin", format="bytes") == b"\x00\x01"
    assert [i.name for i in sbx.files.write_files([{"path": "/tmp/c", "data": "C"}])] == ["c"]
    with pytest.raises(InvalidArgumentError):
        sbx.files.write([{"path": "/tmp/d"}])


def test_read_formats_text_bytes_and_a_stream_of_chunks(sbx):
    blob = bytes(range(256)) * 4096  # 1 MiB
    sbx.files.write("/tmp/blob", blob)
    stream = sbx.files.read("/tmp/blob", format="stream")
    chunks = list(stream)
    assert all(isinstance(c, bytes) for c in chunks) and len(chunks) > 1
    assert b"".join(chunks) == blob
    assert isinstance(sbx.files.read("/tmp/blob", format="bytes"), bytes)
    sbx.files.write("/tmp/t", "é")
    assert sbx.files.read("/tmp/t") == "é"
    with pytest.raises(NotFoundError):
        sbx.files.read("/tmp/missing", format="stream")
    with pytest.raises(InvalidArgumentError):
        sbx.files.read("/tmp/t", format="lines")
    # A stream closed early frees its connection: the sandbox still answers.
    early = sbx.files.read("/tmp/blob", format="stream")
    next(early)
    early.close()
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_a_command_timeout_is_a_timeout_exception_and_still_a_command_exit(sbx):
    with pytest.raises(TimeoutException) as e:
        sbx.commands.run("sleep 30", timeout=0.5)
    assert isinstance(e.value, CommandExitException) and e.value.timed_out
    with pytest.raises(CommandExitException):
        sbx.commands.run("sleep 30", timeout=0.5)
    # A plain failure is not a timeout.
    with pytest.raises(CommandExitException) as f:
        sbx.commands.run("exit 3")
    assert not isinstance(f.value, TimeoutException)


def test_get_info_has_template_id_and_name_and_base_is_the_default_image(service):
    with Sandbox(template="base", timeout=120, **service.sdk()) as s:
        info = s.get_info()
        assert (info.template_id, info.name) == ("base", "base")
        assert info.sandbox_id == s.sandbox_id
        assert s.commands.run("id -un").stdout == "user\n"
        by_id = Sandbox.get_info(s.sandbox_id, **service.sdk())
        assert by_id.sandbox_id == s.sandbox_id and by_id.template_id


def test_get_metrics_reports_memory_cpus_and_disk(sbx):
    [m] = sbx.get_metrics()
    assert m.cpu_count and m.cpu_count >= 1
    assert m.mem_total and 0 < m.mem_used <= m.mem_total
    assert m.cpu_used_pct is not None and 0.0 <= m.cpu_used_pct <= 100.0
    assert m.disk_total and 0 < m.disk_used <= m.disk_total


def test_list_is_a_paginator_and_kill_works_on_the_class(service):
    s = Sandbox.create(timeout=120, metadata={"suite": "e2b-list"}, **service.sdk())
    try:
        pages = Sandbox.list(query={"metadata": {"suite": "e2b-list"}, "state": ["running", "paused"]}, **service.sdk())
        assert pages.has_next
        items = pages.next_items()
        assert [i.sandbox_id for i in items] == [s.sandbox_id]
        assert not pages.has_next
        with pytest.raises(Exception):
            pages.next_items()
        # Still a list, as Sandbox.list() was before.
        assert [i.sandbox_id for i in Sandbox.list(metadata={"suite": "e2b-list"}, **service.sdk())] == [s.sandbox_id]
        Sandbox.set_timeout(s.sandbox_id, 300, **service.sdk())
        assert Sandbox.kill(s.sandbox_id, **service.sdk()) is True
        assert not s.is_running()
        assert Sandbox.kill(s.sandbox_id, **service.sdk()) is False
    finally:
        s.kill()


def test_a_forked_child_keeps_the_parents_default_user(service):
    with Sandbox.create(timeout=120, user="root", **service.sdk()) as s:
        assert s.commands.run("id -un").stdout == "root\n"
        [child] = s.fork()
        try:
            assert child.commands.run("id -un").stdout == "root\n"
        finally:
            child.kill()


def test_async_sandbox_has_the_same_surface(service):
    async def main():
        s = await AsyncSandbox.create(template="base", timeout=120, **service.sdk())
        try:
            r = await s.commands.run("id -un; pwd")
            assert r.stdout == "user\n/home/user\n"
            [a, b] = await s.files.write([{"path": "a.txt", "data": "A" * 300000}, {"path": "/tmp/b", "data": "B"}])
            assert (a.path, a.name, b.path) == ("/home/user/a.txt", "a.txt", "/tmp/b")
            chunks = [c async for c in await s.files.read("a.txt", format="stream")]
            assert b"".join(chunks) == b"A" * 300000
            assert (await s.commands.run("stat -c %U a.txt")).stdout == "user\n"
            with pytest.raises(TimeoutException):
                await s.commands.run("sleep 30", timeout=0.5)
            assert (await s.get_info()).template_id == "base"
            [m] = await s.get_metrics()
            assert m.mem_total and m.mem_used
            pages = await AsyncSandbox.list(**service.sdk())
            assert s.sandbox_id in [i.sandbox_id for i in await pages.next_items()] and not pages.has_next
            assert await AsyncSandbox.kill(s.sandbox_id, **service.sdk()) is True
            assert not await s.is_running()
        finally:
            await s.kill()
            await s.close()

    asyncio.run(main())


def test_bad_user_names_are_refused_before_the_sandbox(sbx):
    for bad in ["a b", "x;id", "-rf", "u" * 33]:
        with pytest.raises(InvalidArgumentError):
            sbx.commands.run("true", user=bad)
    with pytest.raises(InvalidArgumentError):
        sbx.files.write("/tmp/f", "x", user="a/b")


def test_a_template_sandbox_keeps_the_templates_user_unless_a_call_names_one(service):
    Templates.build("e2b-worker", [{"run": "useradd -m worker"}, {"user": "worker"}], **service.sdk())
    try:
        with Sandbox.create(template="e2b-worker", timeout=120, **service.sdk()) as s:
            assert s.default_user is None
            assert s.commands.run("id -un").stdout == "worker\n"
            assert s.commands.run("id -un; pwd", user="user").stdout == "user\n/home/user\n"
            assert s.commands.run("id -un", user="root").stdout == "root\n"
    finally:
        Templates.delete("e2b-worker", **service.sdk())


# Ports of E2B's documented Python examples: only the import differs (and the connection,
# which E2B takes from E2B_API_KEY, set by the fixture).


def test_example_run_commands(e2b_env):
    sandbox = Sandbox()
    result = sandbox.commands.run("ls -l")
    assert result.exit_code == 0
    result = sandbox.commands.run("echo hello; sleep 1; echo world",
                                  on_stdout=lambda data: print(data), on_stderr=lambda data: print(data))
    assert result.stdout == "hello\nworld\n"
    sandbox.kill()


def test_example_background_command(e2b_env):
    sandbox = Sandbox()
    command = sandbox.commands.run("echo hello; sleep 10; echo world", background=True)
    assert command.pid > 0
    command.kill()
    with pytest.raises(CommandExitException):
        command.wait()
    sandbox.kill()


def test_example_read_write_list_files(e2b_env):
    sandbox = Sandbox()
    sandbox.files.write("/home/user/my-file", "file content")
    file_content = sandbox.files.read("/home/user/my-file")
    assert file_content == "file content"
    sandbox.files.write([
        {"path": "/home/user/path/to/a", "data": "file content"},
        {"path": "another/path/to/b", "data": "file content"},
    ])
    files = sandbox.files.list("/home/user")
    assert {"my-file", "path", "another"} <= {f.name for f in files}
    with open(__file__, "rb") as file:
        sandbox.files.write("/home/user/upload.py", file)
    assert sandbox.files.read("/home/user/upload.py", format="bytes") == open(__file__, "rb").read()
    sandbox.kill()


def test_example_environment_variables(e2b_env):
    sandbox = Sandbox(envs={"MY_VAR": "my_value"})
    result = sandbox.commands.run("echo $MY_VAR")
    assert result.stdout == "my_value\n"
    result = sandbox.commands.run("echo $MY_VAR", envs={"MY_VAR": "123"})
    assert result.stdout == "123\n"
    sandbox.kill()


def test_example_sandbox_lifecycle_and_list(e2b_env):
    sandbox = Sandbox(timeout=60, metadata={"name": "My Sandbox"})
    sandbox.set_timeout(30)
    info = sandbox.get_info()
    assert info.metadata == {"name": "My Sandbox"} and info.end_at is not None
    paginator = Sandbox.list()
    running = paginator.next_items()
    assert sandbox.sandbox_id in [s.sandbox_id for s in running]
    sandbox.kill()
