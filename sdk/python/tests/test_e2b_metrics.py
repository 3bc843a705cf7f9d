"""E2B's sandbox metrics (`Sandbox.get_metrics`, and the batch route `GET /sandboxes/metrics`
that the SDK's API client calls) from the sandbox's host cgroups (issue 28): the pinned `e2b`
package, configured only as an E2B user would, on real gVisor sandboxes."""

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


def _batch(ids: list[str]):
    """The batch metrics through the SDK's own API client, as E2B's SDK configures it."""
    from e2b.api.client.api.sandboxes import get_sandboxes_metrics
    from e2b.api.client_sync import get_api_client
    from e2b.connection_config import ConnectionConfig

    return get_sandboxes_metrics.sync_detailed(client=get_api_client(ConnectionConfig()), sandbox_ids=ids)


def test_batch_metrics_answer_each_running_sandbox_named_and_leave_out_the_rest(e2b_env):  # noqa: F811
    a = e2b.Sandbox.create(timeout=300)
    b = e2b.Sandbox.create(timeout=300)
    paused = e2b.Sandbox.create(timeout=300)
    try:
        paused.pause()
        with e2b_env.client() as c:
            limits = c.get(f"/v1/sandboxes/{a.sandbox_id}").json()["limits"]
        r = _batch([a.sandbox_id, b.sandbox_id, paused.sandbox_id, "sbx-0000000000000000"])
        assert r.status_code == 200, r.content
        got = r.parsed.sandboxes
        assert sorted(got) == sorted([a.sandbox_id, b.sandbox_id]), got
        for m in got.values():
            assert m["cpuCount"] == limits["cpus"] and m["memTotal"] == limits["memory_mib"] * MIB, m
            assert m["memUsed"] > 0 and 0 <= m["cpuUsedPct"] <= 100, m
            assert abs(m["timestampUnix"] - datetime.datetime.now().timestamp()) < 60, m

        key = {"X-API-Key": e2b_env.token}
        url = f"{e2b_env.url}/e2b/sandboxes/metrics"
        with httpx.Client(timeout=60) as c:
            r = c.get(url, params={"sandbox_ids": f"{a.sandbox_id},{a.sandbox_id}"}, headers=key)
            assert list(r.json()["sandboxes"]) == [a.sandbox_id], r.text
            r = c.get(url, params={"sandbox_ids": f"{a.sandbox_id},nope"}, headers=key)
            assert (r.status_code, r.json()["code"]) == (400, 400) and '"nope"' in r.json()["message"], r.text
            many = ",".join(f"sbx-{i:016x}" for i in range(101))
            r = c.get(url, params={"sandbox_ids": many}, headers=key)
            assert r.status_code == 400 and "at most 100" in r.json()["message"], r.text
            r = c.get(url, headers=key)
            assert r.status_code == 400 and "sandbox_ids" in r.json()["message"], r.text
            assert c.get(url, params={"sandbox_ids": a.sandbox_id}).status_code == 401
    finally:
        for s in (a, b, paused):
            s.kill()
