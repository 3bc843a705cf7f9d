"""Networked sandboxes through the service: created with E2B's switch or a policy, their policy
read and changed, and a server in one reached at `get_host(port)` from the uplink side and
through branchboxd's proxy behind the token, and a UDP server through its relay. Traffic stays
in the test's own namespace."""

from __future__ import annotations

import asyncio
import subprocess

import httpx
import pytest

from branchbox import (AsyncSandbox, BranchboxError, InvalidArgumentError, NotFoundError, Sandbox,
                      TimeoutException)

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
        with pytest.raises(InvalidArgumentError, match="has no network"):
            sbx.udp(5300)
        with pytest.raises(InvalidArgumentError, match="not both"):
            Sandbox.create(allow_internet_access=True, network={"mode": "internet"}, **networked.sdk())


#: A UDP server for the sandbox: answers each datagram with its bytes reversed.
UDP_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 5300))
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(data[::-1], peer)
"""


def test_udp_reaches_a_sandbox_port_through_the_service_relay_behind_its_token(networked):
    with Sandbox.create(allow_internet_access=False, backend="gvisor", timeout=300, **networked.sdk()) as sbx:
        sbx.files.write("/tmp/echo.py", UDP_ECHO)
        sbx.commands.run("python3 /tmp/echo.py", background=True)
        with sbx.udp(5300) as relay:
            # Datagrams sent before the server binds are lost (the relay goes on): ask until it answers.
            def answered():
                relay.send(b"ready?")
                try:
                    return relay.recv(timeout=1)
                except TimeoutException:
                    return None

            assert wait_until(answered, "the sandbox's UDP server to answer through the relay") == b"?ydaer"
            while True:  # answers to earlier tries that came late
                try:
                    relay.recv(timeout=1)
                except TimeoutException:
                    break
            for datagram in [bytes(range(256)) * 32, b"\x00", b"x" * 60000]:
                relay.send(datagram)
                assert relay.recv(timeout=30) == datagram[::-1], len(datagram)
            with pytest.raises(InvalidArgumentError, match="at most 65507 bytes"):
                relay.send(b"x" * 65508)
            with pytest.raises(InvalidArgumentError):
                relay.send("text")  # type: ignore[arg-type]
        with pytest.raises(BranchboxError, match="has closed"):
            relay.recv(timeout=1)

        async def from_asyncio():
            asbx = await AsyncSandbox.connect(sbx.sandbox_id, **networked.sdk())
            try:
                async with await asbx.udp(5300) as arelay:
                    await arelay.send(b"async")
                    return await arelay.recv(timeout=30)
            finally:
                await asbx.close()

        assert asyncio.run(from_asyncio()) == b"cnysa"

        url = f"{networked.url}/v1/sandboxes/{sbx.sandbox_id}/udp/5300"
        upgrade = {"connection": "upgrade", "upgrade": "websocket", "sec-websocket-version": "13",
                   "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}
        r = httpx.get(url, headers=upgrade, timeout=60)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        r = httpx.get(url, headers=networked.headers(), timeout=60)
        assert (r.status_code, r.json()["error"]["code"]) == (426, "websocket_required")
        r = httpx.get(url.replace("/5300", "/0"), headers={**upgrade, **networked.headers()}, timeout=60)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_port")
        with pytest.raises(InvalidArgumentError):
            sbx.udp(0)
    with pytest.raises(NotFoundError):
        sbx.udp(5300)  # killed on leaving the block


def test_open_ports_is_sent_and_refused_without_a_network(service):
    # The service answers 422 for ports opened on a sandbox that has none: proof the SDK
    # sends the option (a dropped one would create the sandbox).
    with pytest.raises(InvalidArgumentError, match="network"):
        Sandbox.create(open_ports=True, **service.sdk())
