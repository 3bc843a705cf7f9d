"""Many clients at once, and a restart of the service in the middle of activity."""

import asyncio
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from branchbox import AsyncSandbox, CommandExitException, Sandbox
from conftest import procs_under


def _create_run_kill(sdk, i):
    s = Sandbox.create(timeout=600, metadata={"load": "50"}, **sdk)
    try:
        out = s.commands.run(f"echo client-{i}").stdout
        return s.sandbox_id, out
    finally:
        s.kill()
        s.close()


def _fork_and_kill(sdk, i):
    s = Sandbox.create(timeout=600, metadata={"load": "fork"}, **sdk)
    ids = [s.sandbox_id]
    try:
        s.files.write("/home/user/who", str(i))
        kids = s.fork(count=2)
        ok = [k for k in kids if isinstance(k, Sandbox)]
        ids += [k.sandbox_id for k in ok]
        seen = [k.files.read("/home/user/who") for k in ok]
        for k in ok:
            k.kill()
        return ids, len(kids), seen
    finally:
        s.kill()


def test_fifty_concurrent_clients_create_run_fork_and_kill_without_error_or_leak(service):
    # Up to 68 sandboxes of this test may run at once (50, and 6 with two children each) on a
    # service that allows 80; sandboxes earlier tests left in this session's service (about
    # ten, plus their pools' members) would make the test depend on how its clients interleave.
    service.kill_all()
    sdk = service.sdk()
    with ThreadPoolExecutor(max_workers=56) as pool:
        runs = [pool.submit(_create_run_kill, sdk, i) for i in range(50)]
        forks = [pool.submit(_fork_and_kill, sdk, i) for i in range(6)]
        results = [f.result(timeout=900) for f in runs]
        fork_results = [f.result(timeout=900) for f in forks]
    assert sorted(out for _, out in results) == sorted(f"client-{i}\n" for i in range(50))
    assert len({sid for sid, _ in results}) == 50
    all_ids = [sid for sid, _ in results]
    for i, (ids, n, seen) in enumerate(fork_results):
        assert n == 2 and seen == [str(i), str(i)], (ids, seen)
        all_ids += ids
    live = {s.sandbox_id for s in Sandbox.list()}
    assert not live & set(all_ids)
    leaked = [p for sid in all_ids for p in procs_under(service.data_dir / "sandboxes" / sid)]
    assert leaked == []


def test_async_clients_share_the_surface(service):
    async def one(i):
        async with await AsyncSandbox.create(timeout=300, metadata={"async": "yes"}, **service.sdk()) as s:
            await s.files.write("/home/user/n", str(i))
            r = await s.commands.run("cat /home/user/n")
            streamed = []
            await s.commands.run("echo streamed", on_stdout=streamed.append)
            with pytest.raises(CommandExitException):
                await s.commands.run("exit 2")
            kids = await s.fork(count=1)
            child = kids[0]
            assert isinstance(child, AsyncSandbox)
            child_sees = await child.files.read("/home/user/n")
            await child.kill()
            snap = await s.create_snapshot()
            ck = await s.checkpoint()
            await s.files.write("/home/user/n", "changed")
            await s.rollback(ck.snapshot_id)
            after = await s.files.read("/home/user/n")
            lin = await s.lineage()
            info = await s.get_info()
            return r.stdout, "".join(streamed), child_sees, after, snap.kind, bool(lin.snapshots), info.metadata

    async def main():
        return await asyncio.gather(*(one(i) for i in range(4)))

    for i, got in enumerate(asyncio.run(main())):
        assert got == (str(i), "streamed\n", str(i), str(i), "snapshot", True, {"async": "yes"})


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "crash"])
def test_restart_in_the_middle_of_activity_loses_nothing(service, how):
    sdk = service.sdk()
    s = Sandbox.create(timeout=900, metadata={"restart": how.name}, envs={"KEPT": "env"}, **sdk)
    try:
        s.files.write("/home/user/data", "before restart")
        bg = s.commands.run("sleep 600", background=True)
        snap = s.create_snapshot()
        expiry = s.get_info().end_at
        paused = Sandbox.create(timeout=900, **sdk)
        paused.pause()
        stop = threading.Event()
        errors = []

        def churn():
            # Keeps requests in flight while the service goes down and comes back.
            while not stop.is_set():
                try:
                    s.commands.run("true", timeout=5)
                except Exception as e:  # noqa: BLE001 - connection failures are expected here
                    errors.append(type(e).__name__)

        t = threading.Thread(target=churn)
        t.start()
        service.restart(how)
        stop.set()
        t.join(timeout=60)

        info = s.get_info()
        assert (info.state, info.metadata, info.end_at) == ("running", {"restart": how.name}, expiry)
        assert s.files.read("/home/user/data") == "before restart"
        assert s.commands.run("echo $KEPT").stdout == "env\n"
        assert any(p.pid == bg.pid and p.running for p in s.commands.list())
        assert paused.get_info().state == "paused"
        assert Sandbox.connect(paused.sandbox_id).commands.run("echo up").stdout == "up\n"
        with Sandbox.create(snapshot_id=snap.snapshot_id, **sdk) as r:
            assert r.files.read("/home/user/data") == "before restart"
        with service.client() as c:
            log = c.get("/v1/audit", params={"sandbox": s.sandbox_id}).json()
        assert log[0]["action"] == "POST /v1/sandboxes"
        paused.kill()
    finally:
        s.kill()
