"""The SDK's side of fleet listings (docs/fleet.md, "Any node answers for the fleet"), without
Ray: two branchboxd on loopback, each the other's peer (`--peers`, files written once both
have their tokens; the service re-reads them when they change). `Sandbox.list` through either
lists both nodes' sandboxes, each with its `node`; `local=True` lists one node's own; a peer
that does not answer (a closed loopback port in the peers file) is named in
`unanswered_peers` and a `PartialListWarning`, never dropped silently."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import warnings
from pathlib import Path
from typing import Dict, Iterator, Tuple

import httpx
import pytest

from branchbox import AsyncSandbox, PartialListWarning, Sandbox, _api

from conftest import Service, _serve


def _write_peers(path: Path, node: str, peers: Dict[str, Tuple[str, str]]) -> None:
    """A peers file (mode 0600: it holds tokens) naming this node and its peers' url and token."""
    body = {"node": node, "peers": [{"name": n, "url": url, "token": tok} for n, (url, tok) in peers.items()]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pair:
    """Nodes `na` and `nb`, one sandbox on each, all labelled with `tag`."""

    def __init__(self, a: Service, b: Service, a_peers: Path, tag: str) -> None:
        self.a, self.b, self.a_peers, self.tag = a, b, a_peers, tag
        self.on_a = Sandbox.create(timeout=300, metadata={"t": tag}, **a.sdk())
        self.on_b = Sandbox.create(timeout=300, metadata={"t": tag}, **b.sdk())

    def a_peers_with(self, extra: Dict[str, Tuple[str, str]]) -> None:
        _write_peers(self.a_peers, "na", {"nb": (self.b.url, self.b.token), **extra})


@pytest.fixture(scope="module")
def pair(workdir: Path) -> Iterator[Pair]:
    files = {n: workdir / f"py-{os.getpid()}-fleet-{n}-peers.json" for n in ("a", "b")}
    try:
        with _serve(workdir, "fleet-a", "--peers", str(files["a"])) as a, \
                _serve(workdir, "fleet-b", "--peers", str(files["b"])) as b:
            _write_peers(files["b"], "nb", {"na": (a.url, a.token)})
            p = Pair(a, b, files["a"], secrets.token_hex(6))
            p.a_peers_with({})
            yield p
    finally:
        for f in files.values():
            f.unlink(missing_ok=True)


def test_a_listing_through_either_node_has_both_nodes_sandboxes_each_with_its_node(pair: Pair) -> None:
    want = {pair.on_a.sandbox_id: "na", pair.on_b.sandbox_id: "nb"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialListWarning)
        through_a = Sandbox.list(metadata={"t": pair.tag}, **pair.a.sdk())
        through_b = asyncio.run(AsyncSandbox.list(metadata={"t": pair.tag}, **pair.b.sdk()))
    for got in (through_a, through_b):
        assert {i.sandbox_id: i.node for i in got} == want
        assert got.unanswered_peers == {}


def test_local_lists_only_the_asked_nodes_own_sandboxes(pair: Pair) -> None:
    mine = Sandbox.list(metadata={"t": pair.tag}, local=True, **pair.a.sdk())
    assert [(i.sandbox_id, i.node) for i in mine] == [(pair.on_a.sandbox_id, None)]
    theirs = asyncio.run(AsyncSandbox.list(query={"metadata": {"t": pair.tag}}, local=True, **pair.b.sdk()))
    assert [i.sandbox_id for i in theirs] == [pair.on_b.sandbox_id]


def test_fleet_capacity_counts_the_nodes_own_sandboxes_against_its_cap(pair: Pair) -> None:
    cap = Sandbox.fleet_capacity(**pair.a.sdk())
    assert cap["sandboxes"] == 1 and cap["room"] == cap["max_sandboxes"] - 1, cap
    assert asyncio.run(AsyncSandbox.fleet_capacity(**pair.b.sdk()))["sandboxes"] == 1


def test_a_dead_peer_is_named_in_a_warning_and_on_the_listing(pair: Pair) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    pair.a_peers_with({"gone": (dead, "t" * 32)})
    try:
        with pytest.warns(PartialListWarning, match=r"gone \(did not answer") as caught:
            got = Sandbox.list(metadata={"t": pair.tag}, **pair.a.sdk())
        assert list(got.unanswered_peers) == ["gone"]
        assert got.unanswered_peers["gone"].startswith("did not answer"), got.unanswered_peers
        assert caught[0].message.unanswered == got.unanswered_peers
        assert caught[0].filename == __file__, "the warning points at the caller's line"
        # What did answer is still listed.
        assert {i.sandbox_id for i in got} == {pair.on_a.sandbox_id, pair.on_b.sandbox_id}

        with pytest.warns(PartialListWarning, match="gone"):
            agot = asyncio.run(AsyncSandbox.list(metadata={"t": pair.tag}, **pair.a.sdk()))
        assert list(agot.unanswered_peers) == ["gone"]

        # Turned into an error by the caller's own filter, as any warning can be.
        with warnings.catch_warnings():
            warnings.simplefilter("error", PartialListWarning)
            with pytest.raises(PartialListWarning):
                Sandbox.list(**pair.a.sdk())
            # local=True asks no peer, so nothing is missing.
            assert Sandbox.list(metadata={"t": pair.tag}, local=True, **pair.a.sdk()).unanswered_peers == {}
    finally:
        pair.a_peers_with({})


def test_the_unanswered_header_reads_as_names_and_reasons_and_an_odd_one_is_kept_whole() -> None:
    def read(header: str) -> Dict[str, str]:
        return _api.unanswered_peers(httpx.Response(200, headers={_api.UNANSWERED_HEADER: header}))

    assert read("n4 (no answer in 3 s), n5 (did not answer: error (refused), again)") == {
        "n4": "no answer in 3 s", "n5": "did not answer: error (refused), again"}
    assert read("not the service's shape") == {"?": "not the service's shape"}
    assert _api.unanswered_peers(httpx.Response(200)) == {}
