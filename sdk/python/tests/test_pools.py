"""Warm pools on a live branchboxd: claims get a fresh identity and the claim's env, metadata and
files; an empty pool waits then fails clearly, or cold-starts only when allowed and says so;
pools survive a restart; ready sandboxes are not the user's until claimed."""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from branchbox import AsyncSandbox, InvalidArgumentError, NotFoundError, Pool, Sandbox, ServiceUnavailableError, Templates

from conftest import Service, _serve, wait_until


def _identity(s: Sandbox) -> tuple:
    # A sandbox that was never forked or restored may have no machine-id yet: it reads empty.
    r = s.commands.run('echo "$(cat /etc/machine-id 2>/dev/null)|$(hostname)"')
    machine_id, hostname = r.stdout.strip().split("|")
    return machine_id, hostname


@pytest.fixture(scope="module")
def pools(workdir, service) -> Iterator[tuple]:
    """A service of its own with room for 4 sandboxes, and a snapshot of a prepared sandbox."""
    with _serve(workdir, "pools", "--max-sandboxes", "4") as svc:
        src = Sandbox.create(timeout=600, **svc.sdk())
        src.files.write("/root/prepared.txt", "from the snapshot", user="root")
        snap = src.create_snapshot("pool-src")
        try:
            yield svc, src, snap.snapshot_id
        finally:
            for p in Pool.list(**svc.sdk()):
                Pool.connect(p.name, **svc.sdk()).delete()
            src.kill()


def _full(svc: Service, name: str, size: int):
    return wait_until(lambda: (lambda i: i if i.ready == size else None)(Pool.connect(name, **svc.sdk()).get_info()),
                      f"pool {name} holding {size} ready sandboxes", limit=180)


def test_a_claim_has_a_fresh_identity_and_the_claimed_env_files_and_metadata(pools):
    svc, src, snap = pools
    pool = Pool.create("ident", 2, snapshot=snap, **svc.sdk())
    try:
        ready = _full(svc, "ident", 2)
        listed = {s.sandbox_id for s in Sandbox.list(**svc.sdk())}
        assert not listed & set(ready.members), "ready sandboxes are listed as the user's before a claim"
        a = pool.claim(envs={"GREETING": "hi-a"}, metadata={"who": "a"}, files={"/root/in.txt": "claimed a"})
        b = Sandbox.claim("ident", envs={"GREETING": "hi-b"}, files={"/root/bin.dat": b"\x00\x01b"}, **svc.sdk())
        try:
            assert a.claim_info.source == b.claim_info.source == "pool"
            assert a.sandbox_id in ready.members and b.sandbox_id in ready.members
            assert a.claim_info.identity["machine_id"] == "applied", a.claim_info.identity
            ids = [_identity(s) for s in (a, b, src)]
            assert len({m for m, _ in ids}) == 3, f"machine-ids shared: {ids}"
            assert len({h for _, h in ids}) == 3, f"hostnames shared: {ids}"
            assert a.commands.run("echo $GREETING").stdout.strip() == "hi-a"
            assert b.commands.run("echo $GREETING").stdout.strip() == "hi-b"
            assert a.files.read("/root/in.txt", user="root") == "claimed a"
            assert b.files.read("/root/bin.dat", format="bytes", user="root") == b"\x00\x01b"
            assert a.files.read("/root/prepared.txt", user="root") == "from the snapshot"
            assert a.get_info().metadata == {"who": "a"}
            listed = {s.sandbox_id for s in Sandbox.list(**svc.sdk())}
            assert {a.sandbox_id, b.sandbox_id} <= listed
        finally:
            a.kill()
            b.kill()
    finally:
        pool.delete()


def test_an_empty_pool_waits_then_fails_and_a_cold_start_only_when_allowed(pools):
    svc, src, snap = pools
    # The source and the pool's 2 ready sandboxes fill 3 of the service's 4 places; after two
    # claims and one refill all 4 are taken, so the pool stays empty while both claims live.
    pool = Pool.create("empty", 2, snapshot=snap, **svc.sdk())
    claimed = []
    try:
        _full(svc, "empty", 2)
        claimed.append(pool.claim())
        wait_until(lambda: pool.get_info().ready == 2, "a refill after the first claim", limit=180)
        claimed.append(pool.claim())
        claimed.append(pool.claim())
        assert pool.get_info().ready == 0
        with pytest.raises(ServiceUnavailableError) as e:
            pool.claim(wait=1)
        assert e.value.code == "pool_empty", e.value
        assert "allow_cold" in str(e.value) and "at most 4 sandboxes" in str(e.value), str(e.value)
        # Two places freed: a refill may take one of them, never both before this claim looks
        # (a refill restores one sandbox at a time, which takes far longer than the claim's
        # look at the pool), so the pool is still empty and the cold start has its place.
        claimed.pop().kill()
        claimed.pop().kill()
        cold = pool.claim(allow_cold=True, wait=0)
        claimed.append(cold)
        assert cold.claim_info.source == "cold"
        assert cold.files.read("/root/prepared.txt", user="root") == "from the snapshot"
        info = pool.get_info()
        assert info.claims_cold == 1 and info.claims_pool == 3
    finally:
        for s in claimed:
            s.kill()
        pool.delete()


def test_pools_survive_a_restart_and_show_their_memory(pools):
    svc, src, snap = pools
    Pool.create("lasting", 2, snapshot=snap, max_idle=3600, **svc.sdk())
    try:
        before = _full(svc, "lasting", 2)
        with svc.client() as c:
            text = c.get("/metrics").text
        assert 'branchbox_pool_ready{pool="lasting"} 2' in text
        assert before.memory_bytes is not None and before.memory_bytes > 0
        assert f'branchbox_pool_memory_bytes{{pool="lasting"}} ' in text
        svc.restart()
        after = Pool.connect("lasting", **svc.sdk()).get_info()
        assert after.size == 2 and after.snapshot == snap
        assert after.members == before.members, "ready sandboxes alive at the restart were not re-adopted"
        # A ready sandbox that dies is dropped and replaced: the pool refills to its size.
        with svc.client() as c:
            assert c.delete(f"/v1/sandboxes/{before.members[0]}").status_code == 204
        refilled = wait_until(
            lambda: (lambda i: i if i.ready == 2 and before.members[0] not in i.members else None)(
                Pool.connect("lasting", **svc.sdk()).get_info()),
            "the pool refilled after losing a ready sandbox", limit=180)
        assert before.members[1] in refilled.members
    finally:
        Pool.connect("lasting", **svc.sdk()).delete()


def test_a_pool_of_a_template_hands_out_its_last_build_with_its_env_and_workdir(pools):
    svc, _src, _snap = pools
    steps = [
        {"file": "/srv/tpl/marker.txt", "content": "built by the template\n", "mode": "644"},
        {"env": {"TPL_MODE": "pooled"}},
        {"workdir": "/srv/tpl"},
    ]
    Templates.build("pool-tpl", steps, **svc.sdk())
    pool = Pool.create("from-tpl", 1, template="pool-tpl", **svc.sdk())
    try:
        _full(svc, "from-tpl", 1)
        s = pool.claim()
        try:
            assert s.claim_info.source == "pool"
            r = s.commands.run('echo "$TPL_MODE|$(pwd)|$(cat marker.txt)"')
            assert r.stdout.strip() == "pooled|/srv/tpl|built by the template", r
        finally:
            s.kill()
    finally:
        pool.delete()
        Templates.delete("pool-tpl", **svc.sdk())


def test_a_pool_grows_shrinks_and_keeps_its_new_size_through_a_restart(pools):
    svc, _src, snap = pools
    pool = Pool.create("resize", 1, snapshot=snap, max_idle=3600, **svc.sdk())
    claimed = None
    try:
        _full(svc, "resize", 1)
        assert pool.update(size=3).size == 3
        full = _full(svc, "resize", 3)
        # The source, a claimed sandbox and the 2 ready ones fill the service's 4 places.
        claimed = pool.claim()
        left = [m for m in full.members if m != claimed.sandbox_id]
        shrunk = pool.update(size=1)
        assert shrunk.size == 1 and shrunk.ready == 1, shrunk
        assert shrunk.members == left[1:], "a shrink keeps the newest ready sandbox and retires the oldest"
        with svc.client() as c:
            assert c.get(f"/v1/sandboxes/{left[0]}").status_code == 404, "the retired sandbox still exists"
        assert claimed.commands.run("echo still-mine").stdout.strip() == "still-mine"
        for bad in ({"size": 0}, {"size": 65}, {"size": 5}, {"max_idle": 0}, {"max_idle": -1},
                    {"max_idle": 8 * 24 * 3600}, {}):
            with pytest.raises(InvalidArgumentError) as e:
                pool.update(**bad)
            assert e.value.code == "invalid_input", (bad, e.value)
        with svc.client() as c:
            r = c.patch("/v1/pools/resize", json={"size": 2, "paused": True})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_body", r.text
        unchanged = pool.get_info()
        assert (unchanged.size, unchanged.max_idle, unchanged.members) == (1, 3600, shrunk.members)
        with pytest.raises(NotFoundError):
            Pool("no-such-pool", pool._http).update(size=1)
        assert pool.update(max_idle=120).max_idle == 120
        svc.restart()
        after = Pool.connect("resize", **svc.sdk()).get_info()
        assert (after.size, after.max_idle, after.members) == (1, 120, shrunk.members)
    finally:
        if claimed is not None:
            claimed.kill()
        Pool.connect("resize", **svc.sdk()).delete()


def test_an_async_claim_hands_out_a_ready_sandbox_with_the_claimed_env_and_files(pools):
    svc, _src, snap = pools
    pool = Pool.create("async", 1, snapshot=snap, **svc.sdk())
    try:
        ready = _full(svc, "async", 1)

        async def claim() -> tuple:
            s = await AsyncSandbox.claim("async", envs={"GREETING": "async"}, files={"/root/a.txt": "claimed"},
                                         metadata={"via": "async"}, wait=0, **svc.sdk())
            try:
                # The claimed files are root's (/root is private); the SDK's default user is `user`.
                r = await s.commands.run('echo "$GREETING|$(cat /root/a.txt)|$(cat /root/prepared.txt)"',
                                         user="root")
                return s.sandbox_id, s.claim_info, r.stdout.strip(), (await s.get_info()).metadata
            finally:
                await s.kill()
                await s.close()

        sid, info, out, metadata = asyncio.run(claim())
        assert sid in ready.members and info.source == "pool" and info.pool == "async", info
        assert info.identity["machine_id"] == "applied", info
        assert out == "async|claimed|from the snapshot"
        assert metadata == {"via": "async"}
    finally:
        pool.delete()
