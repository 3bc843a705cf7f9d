"""`sudo` by its full path, `/usr/bin/sudo`, as E2B users' scripts call it (issue 28): gVisor keeps
the image's setuid sudo from ever working, so the sandbox's agent puts its stand-in there too.
The pinned `e2b` package, configured only as an E2B user would, on a real gVisor sandbox."""

from __future__ import annotations

import pytest

from test_e2b_fixes import e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")


def test_usr_bin_sudo_runs_as_root_for_user_and_refuses_others(e2b_env):  # noqa: F811
    sbx = e2b.Sandbox.create(timeout=120)
    try:
        run = sbx.commands.run
        assert run("/usr/bin/sudo -n true").exit_code == 0
        assert run("/usr/bin/sudo whoami").stdout == "root\n"
        assert run("/usr/bin/sudo -n -E sh -c 'echo $SUDO_USER $(id -u)'").stdout == "user 0\n"
        # What the path is now: the agent's stand-in, not a setuid program.
        assert run("readlink /usr/bin/sudo").stdout == "/usr/local/bin/branchbox-agent\n"
        with pytest.raises(e2b.CommandExitException) as e:
            run("/usr/bin/sudo -n true", user="nobody", cwd="/tmp")
        assert "may not run commands as root" in e.value.stderr
    finally:
        sbx.kill()
