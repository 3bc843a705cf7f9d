"""E2B's network options (`allow_internet_access`, `network` allow and deny rules, public-traffic
settings, `update_network`) on branchbox's egress policy, and the rules `get_info` shows for it
(issue 28): the pinned `e2b` package,
configured only as an E2B user would, on real gVisor sandboxes. Traffic goes only to two test
hosts this module puts in the networked service's uplink namespace (the test run's own)."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import wait_until
from test_e2b_fixes import e2b_env  # noqa: F401  (the fixture)

e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (pip install -r sdk/python/requirements-test.txt)")
ALL_TRAFFIC = "0.0.0.0/0"

#: The test hosts: documentation addresses, public to branchbox's policy.
HOSTS = ("203.0.113.10", "198.51.100.20")
PORT = 8000

#: Tries a TCP connection to each host given; prints `open` or `closed` for each.
PROBE = f"""
import socket, sys
for host in sys.argv[1:]:
    try:
        socket.create_connection((host, {PORT}), timeout=5).close()
        print(host, "open")
    except OSError:
        print(host, "closed")
"""


@pytest.fixture(scope="module")
def test_hosts(networked):
    """An HTTP server on both test addresses, on the loopback of the networked service's uplink
    namespace; the addresses and the server are gone afterwards."""
    ns = networked.netns
    for a in HOSTS:
        subprocess.run(["ip", "-n", ns, "addr", "add", f"{a}/32", "dev", "lo"], check=True)
    server = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind", "0.0.0.0",
                               str(PORT)], cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers():
            out = subprocess.run(["ip", "netns", "exec", ns, "curl", "-s", "-o", "/dev/null", "-m", "2",
                                  f"http://{HOSTS[0]}:{PORT}/"], capture_output=True)
            return out.returncode == 0

        wait_until(answers, "the test hosts' server to answer", 30)
        yield networked
    finally:
        server.kill()
        server.wait()
        for a in HOSTS:
            subprocess.run(["ip", "-n", ns, "addr", "del", f"{a}/32", "dev", "lo"], check=False)


@pytest.fixture
def e2b_net(test_hosts, monkeypatch):
    """Only what an E2B user sets, pointed at the networked service."""
    for k in list(os.environ):
        if k.startswith(("BRANCHBOX_", "E2B_")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{test_hosts.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{test_hosts.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", test_hosts.token)
    monkeypatch.setenv("E2B_VALIDATE_API_KEY", "false")
    return test_hosts


def _reach(sbx) -> dict:
    sbx.files.write("/tmp/probe.py", PROBE)
    out = sbx.commands.run(f"python3 /tmp/probe.py {' '.join(HOSTS)}").stdout
    return dict(line.split() for line in out.splitlines())


#: The ranges branchbox's internet mode refuses: what `get_info` shows it as (`deny_out`).
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8",
           "0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "224.0.0.0/3"]


def _shown(sbx) -> tuple:
    """The network rules and `allow_internet_access` of the sandbox's E2B info."""
    info = sbx.get_info()
    return info.network, info.allow_internet_access


def _policy(service, sandbox_id: str) -> dict:
    with service.client() as c:
        r = c.get(f"/v1/sandboxes/{sandbox_id}/network")
        assert r.status_code == 200, r.text
        return r.json()["policy"]


def test_allow_and_deny_rules_are_enforced_and_updated_while_running(e2b_net):
    sbx = e2b.Sandbox.create(timeout=300, network={"allow_out": [HOSTS[0]], "deny_out": [ALL_TRAFFIC]})
    try:
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "allow_list", "allow": [f"{HOSTS[0]}/32"]}
        listed = {"deny_out": [ALL_TRAFFIC], "dns_servers": [], "allow_public_traffic": False}
        assert _shown(sbx) == ({"allow_out": [f"{HOSTS[0]}/32"], **listed}, False)
        assert _reach(sbx) == {HOSTS[0]: "open", HOSTS[1]: "closed"}

        sbx.update_network({"allow_out": [f"{HOSTS[1]}/32"], "deny_out": [ALL_TRAFFIC]})
        assert _shown(sbx) == ({"allow_out": [f"{HOSTS[1]}/32"], **listed}, False)
        assert _reach(sbx) == {HOSTS[0]: "closed", HOSTS[1]: "open"}

        # As on E2B, what an update leaves out is cleared: no rules, the internet, which
        # branchbox shows as the private ranges it refuses.
        sbx.update_network({})
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "internet"}
        internet = ({"deny_out": PRIVATE, "allow_public_traffic": False}, True)
        assert _shown(sbx) == internet
        assert _reach(sbx) == {HOSTS[0]: "open", HOSTS[1]: "open"}

        e2b.Sandbox.update_network(sbx.sandbox_id, {"allow_internet_access": False})
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "deny_all"}
        assert _shown(sbx) == ({"deny_out": [ALL_TRAFFIC], "allow_public_traffic": False}, False)
        assert _reach(sbx) == {HOSTS[0]: "closed", HOSTS[1]: "closed"}

        # What get_info shows, given back to update_network, sets the same policy.
        sbx.update_network(internet[0])
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "internet"}
        sbx.update_network({"allow_out": ["pypi.org", HOSTS[1]], "deny_out": [ALL_TRAFFIC]})
        shown, _ = _shown(sbx)
        assert shown["allow_out"] == [f"{HOSTS[1]}/32", "pypi.org"] and shown["dns_servers"] == [], shown
        sbx.update_network({"allow_internet_access": False})
        sbx.update_network(shown)
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "allow_list", "allow": [f"{HOSTS[1]}/32", "pypi.org"]}
        e2b.Sandbox.update_network(sbx.sandbox_id, {"allow_internet_access": False})

        # A rule branchbox cannot honour changes nothing.
        with pytest.raises(e2b.SandboxException, match="denyOut 198.51.100.0/24"):
            sbx.update_network({"deny_out": ["198.51.100.0/24"]})
        assert _policy(e2b_net, sbx.sandbox_id) == {"mode": "deny_all"}
    finally:
        sbx.kill()
    with pytest.raises(e2b.SandboxNotFoundException):
        e2b.Sandbox.update_network(sbx.sandbox_id, {})
    with pytest.raises(e2b.SandboxNotFoundException):
        e2b.Sandbox.update_network("x", {})


def test_allow_internet_access_false_with_allow_out_reaches_only_the_list(e2b_net):
    sbx = e2b.Sandbox.create(timeout=300, allow_internet_access=False, network={"allow_out": [HOSTS[1]]})
    try:
        assert _reach(sbx) == {HOSTS[0]: "closed", HOSTS[1]: "open"}
        shown = {"allow_out": [f"{HOSTS[1]}/32"], "deny_out": [ALL_TRAFFIC], "dns_servers": [],
                 "allow_public_traffic": False}
        assert _shown(sbx) == (shown, False)
        assert e2b.Sandbox.get_info(sbx.sandbox_id).network == shown
    finally:
        sbx.kill()


REFUSED = [
    ({"egress_proxy": {"address": "proxy.example.com:1080"}}, "egressProxy"),
    ({"rules": {"api.example.com": [{}]}}, "network rules"),
    ({"allow_public_traffic": True}, "allowPublicTraffic"),
    ({"mask_request_host": "${PORT}-app.example.com"}, "maskRequestHost"),
    ({"https_ports": [3000]}, "httpsPorts"),
    ({"deny_out": ["198.51.100.0/24"]}, "denyOut 198.51.100.0/24"),
    ({"allow_out": ["10.0.0.0/8"]}, "allowOut 10.0.0.0/8"),
    ({"deny_out": ["example.com"]}, "networks and addresses only"),
]


def test_options_branchbox_cannot_honour_are_refused_by_name(e2b_env):  # noqa: F811
    def count():
        with e2b_env.client() as c:
            return len(c.get("/v1/sandboxes").json())

    before = count()
    for network, named in REFUSED:
        with pytest.raises(e2b.SandboxException, match=named) as e:
            e2b.Sandbox.create(timeout=60, network=network)
        assert e.value.status_code == 400, e.value
    assert count() == before, "a refused create made a sandbox"
    # A sandbox made without a network cannot be given rules later; its info shows no rules
    # and no internet.
    sbx = e2b.Sandbox.create(timeout=120)
    try:
        assert _shown(sbx) == (None, False)
        with pytest.raises(e2b.SandboxException, match="has no network"):
            sbx.update_network({"allow_out": [HOSTS[0]], "deny_out": [ALL_TRAFFIC]})
    finally:
        sbx.kill()
