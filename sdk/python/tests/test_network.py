"""Networked sandboxes through the service: created with E2B's switch or a policy, their policy
read and changed, and a server in one reached at `get_host(port)` from the uplink side and
through branchboxd's proxy behind the token. Traffic stays in the test's own namespace."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from branchbox import InvalidArgumentError, Sandbox

from conftest import wait_until


def _from_uplink(netns: str, url: str) -> str:
    out = subprocess.run(["ip", "netns", "exec", netns, "curl", "-s", "-f", "-m", "5", url], capture_output=True)
    return out.stdout.decode().strip() if out.returncode == 0 else ""


def test_a_networked_sandbox_serves_at_get_host_and_through_the_proxy(networked):
    with Sandbox.create(allow_internet_access=False, backend="gvisor", timeout=300, **networked.sdk()) as sbx:
        info = sbx.get_network()
        assert (info.mode, info.allow) == ("deny_all", [])
        info = sbx.set_network("allow_list", ["pypi.org", "192.0.2.0/24"])
        assert (info.mode, info.allow) == ("allow_list", ["192.0.2.0/24", "pypi.org"])
        with pytest.raises(InvalidArgumentError, match="not a host name"):
            sbx.set_network("allow_list", ["pypi.org; flush ruleset"])
        assert sbx.get_network().allow == ["192.0.2.0/24", "pypi.org"], "a refused change applied"
        sbx.commands.run(f"mkdir -p /tmp/www && echo {sbx.sandbox_id} > /tmp/www/whoami")
        sbx.commands.run("python3 -m http.server 8080 --directory /tmp/www", background=True)
        host = sbx.get_host(8080)
        assert host.endswith(":8080"), host
        wait_until(lambda: _from_uplink(networked.netns, f"http://{host}/whoami") == sbx.sandbox_id,
                   f"the sandbox's server to answer at {host}")
        url = sbx.proxy_url(8080) + "whoami"
        r = httpx.get(url, headers=networked.headers(), timeout=60)
        assert (r.status_code, r.text.strip()) == (200, sbx.sandbox_id), r.text
        assert httpx.get(url, timeout=60).status_code == 401
        with pytest.raises(InvalidArgumentError):
            sbx.get_host(0)
        with pytest.raises(InvalidArgumentError):
            sbx.set_network("everything")


def test_a_sandbox_without_a_network_says_so(networked):
    with Sandbox.create(backend="gvisor", timeout=300, **networked.sdk()) as sbx:
        with pytest.raises(InvalidArgumentError, match="has no network"):
            sbx.get_host(8080)
        with pytest.raises(InvalidArgumentError, match="not both"):
            Sandbox.create(allow_internet_access=True, network={"mode": "internet"}, **networked.sdk())
