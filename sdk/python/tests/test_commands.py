"""Commands through the SDK: output, exit codes, environment, cwd, stdin, timeouts, streaming
callbacks, background processes and signals."""

import pytest

from branchbox import CommandExitException, Sandbox, TimeoutException


def test_run_returns_stdout_stderr_and_exit_code(sbx):
    r = sbx.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 0)


def test_argv_runs_without_a_shell(sbx):
    assert sbx.commands.run(["echo", "$HOME", "a b"]).stdout == "$HOME a b\n"


def test_non_zero_exit_raises_with_output(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo partial; echo broke >&2; exit 7")
    assert (e.value.exit_code, e.value.stdout, e.value.stderr) == (7, "partial\n", "broke\n")


def test_sandbox_and_command_envs_merge_with_command_winning(service):
    with Sandbox.create(envs={"A": "from-sandbox", "B": "kept"}, **service.sdk()) as s:
        r = s.commands.run("echo $A $B", envs={"A": "from-command"})
        assert r.stdout == "from-command kept\n"


def test_cwd_and_stdin(sbx):
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("tr a-z A-Z", stdin="shout").stdout == "SHOUT"


def test_timeout_kills_the_command(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("sleep 30", timeout=0.5)
    assert e.value.timed_out and e.value.exit_code is None


def test_streaming_callbacks_get_output_in_order_and_whole_characters(sbx):
    out, err = [], []
    script = "import sys,time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.05)\n" \
             "sys.stderr.write('é' * 3000); sys.stderr.flush()"
    r = sbx.commands.run(["python3", "-c", script], on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "0\n1\n2\n" == r.stdout
    assert "".join(err) == "é" * 3000 == r.stderr
    assert "\ufffd" not in r.stderr


def test_streamed_failure_raises_too(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo x; exit 4", on_stdout=lambda _: None)
    assert e.value.exit_code == 4 and e.value.stdout == "x\n"


def test_background_process_lists_waits_and_is_killed(sbx):
    h = sbx.commands.run("echo started; sleep 60", background=True)
    assert h.pid > 0
    procs = {p.pid: p for p in sbx.commands.list()}
    assert procs[h.pid].running
    with pytest.raises(TimeoutException):
        h.wait(timeout=0.2)
    assert h.kill()
    with pytest.raises(CommandExitException) as e:
        h.wait(timeout=10)
    assert e.value.signal == 9 and "started" in e.value.stdout


def test_background_process_result(sbx):
    h = sbx.commands.run(["sh", "-c", "echo done"], background=True)
    assert h.wait(timeout=30).stdout == "done\n"


def test_signal_to_a_missing_process_reports_not_found(sbx):
    assert sbx.commands.kill(999_999) is False


def test_a_memory_hog_is_killed_in_the_sandbox_and_the_result_says_so(service):
    with Sandbox.create(timeout=600, memory_mib=256, **service.sdk()) as s:
        with pytest.raises(CommandExitException) as e:
            s.commands.run("python3 -c 'b = bytearray(600 * 1024 * 1024); print(len(b))'", timeout=60)
        assert e.value.oom_killed, e.value
        assert "memory limit" in str(e.value)
        # The sandbox outlived its workload.
        assert s.commands.run("echo alive").stdout == "alive\n"
