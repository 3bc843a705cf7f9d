"""E2B's sandbox metrics (`Sandbox.get_metrics`) from the sandbox's host cgroups (issue 28): the
pinned `e2b` package, configured only as an E2B user would, on real gVisor sandboxes."""

from __future__ import annotations

import datetime

import httpx
import pytest

from test_e2b_fixes import e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")

MIB = 1 << 20

#: Holds 96 MiB of memory and one CPU busy until killed.
BUSY = "import time; held = bytearray(96 << 20); held[::4096] = b'x' * len(held[::4096])\nwhile True: pass"


def test_metrics_report_the_sandboxs_limits_and_what_it_uses(e2b_env):  # noqa: F811
    sbx = e2b.Sandbox.create(timeout=300)
    try:
        with e2b_env.client() as c:
            limits = c.get(f"/v1/sandboxes/{sbx.sandbox_id}").json()["limits"]
        idle = sbx.get_metrics()
        assert len(idle) == 1, idle
        m = idle[0]
        assert m.cpu_count == limits["cpus"]
        assert m.mem_total == limits["memory_mib"] * MIB
        assert 0 <= m.cpu_used_pct <= 100
        assert m.mem_used > 0 and m.mem_cache >= 0
        assert (m.disk_used, m.disk_total) == (0, 0)
        assert abs((datetime.datetime.now(datetime.timezone.utc) - m.timestamp).total_seconds()) < 60

        sbx.files.write("/tmp/busy.py", BUSY)
        sbx.commands.run("python3 /tmp/busy.py", background=True, timeout=0)
        sbx.commands.run("sleep 2")
        busy = e2b.Sandbox.get_metrics(sbx.sandbox_id)[0]
        assert busy.cpu_used_pct > 0, busy
        assert busy.mem_used >= m.mem_used + 64 * MIB, (m, busy)

        # An interval that ended before now holds no point; one reaching now holds it.
        hour_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
        assert sbx.get_metrics(end=hour_ago) == []
        assert len(sbx.get_metrics(start=hour_ago)) == 1
        with e2b_env.client() as c:
            key = {"X-API-Key": e2b_env.token}
            r = c.get(f"/e2b/sandboxes/{sbx.sandbox_id}/metrics?start=20&end=10", headers=key)
            assert (r.status_code, r.json()["code"]) == (400, 400), r.text
            r = c.get(f"/e2b/sandboxes/{sbx.sandbox_id}/metrics?step=5", headers=key)
            assert r.status_code == 400 and "step" in r.json()["message"], r.text
        r = httpx.get(f"{e2b_env.url}/e2b/sandboxes/{sbx.sandbox_id}/metrics", timeout=60)
        assert r.status_code == 401, r.text
    finally:
        sbx.kill()
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.get_metrics(sbx.sandbox_id)


def test_metrics_of_unknown_sandboxes_are_not_found(e2b_env):  # noqa: F811
    for bad in ("sbx-0000000000000000", "x"):
        with pytest.raises(e2b.NotFoundException):
            e2b.Sandbox.get_metrics(bad)
