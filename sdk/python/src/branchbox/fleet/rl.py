"""An RL environment over branchbox sandboxes, for trainers that run on Ray.

`Env` is one sandbox plus the checkpoint its episodes start from: `reset()` rolls the sandbox
back in place to that checkpoint (files, processes and memory), `step(action)` runs a command,
`fork(n)` gives `n` environments that continue from now, `checkpoint()` marks a new state.
`run_episodes` spreads episodes from one start state over the fleet's nodes, one Ray task per
node, each reusing one sandbox with `reset()` between episodes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ..exceptions import CommandExitException
from ..sandbox import Sandbox
from .cluster import NODE_LABEL


@dataclass
class Step:
    """What one `step` gives back."""

    observation: str
    exit_code: int
    done: bool
    seconds: float
    stderr: str = ""


class Env:
    """An environment: one sandbox and the checkpoint its episodes start from.

    `max_steps` ends an episode after that many steps; `done_when(step)` may end it earlier
    (for example when the observation says the task is solved)."""

    def __init__(self, sandbox: Sandbox, start: Optional[str] = None, max_steps: Optional[int] = None,
                 done_when: Optional[Callable[[Step], bool]] = None, node: Optional[str] = None) -> None:
        self.sandbox = sandbox
        self.node = node
        self.max_steps = max_steps
        self.done_when = done_when
        self.start = start or sandbox.checkpoint().snapshot_id
        self.steps = 0

    @classmethod
    def create(cls, fleet: Any = None, snapshot_id: Optional[str] = None, node: Optional[str] = None,
               setup: Sequence[str] = (), background: Sequence[str] = (), max_steps: Optional[int] = None,
               done_when: Optional[Callable[[Step], bool]] = None, **kwargs: Any) -> "Env":
        """A new environment from `snapshot_id` (or the default image) on the fleet's `node`
        (or its least loaded one; without a fleet, on the service `Sandbox.create` finds). The
        `setup` commands run first, then the `background` ones are started (servers the episodes
        talk to), and the checkpoint after them is where episodes start."""
        if fleet is not None:
            sbx = fleet.create(node=node, snapshot_id=snapshot_id, **kwargs)
            node = fleet.node_of(sbx)
        else:
            sbx = Sandbox.create(snapshot_id=snapshot_id, **kwargs)
        try:
            for cmd in setup:
                sbx.commands.run(cmd)
            for cmd in background:
                sbx.commands.run(cmd, background=True)
            return cls(sbx, max_steps=max_steps, done_when=done_when, node=node)
        except BaseException:
            sbx.kill()
            raise

    def reset(self) -> str:
        """Rolls the sandbox back, in place, to the episode's start; returns that checkpoint."""
        self.sandbox.rollback(self.start)
        self.steps = 0
        return self.start

    def step(self, action: str, timeout: float = 60.0) -> Step:
        """Runs `action` (a shell command) and returns its output, exit status and whether the
        episode is over. A non-zero exit is an observation, not an error."""
        t0 = time.monotonic()
        try:
            r = self.sandbox.commands.run(action, timeout=timeout)
            out, err, code = r.stdout, r.stderr, r.exit_code
        except CommandExitException as e:
            out, err, code = e.stdout, e.stderr, (e.exit_code if e.exit_code is not None else -1)
        self.steps += 1
        st = Step(observation=out, exit_code=code, done=False, seconds=time.monotonic() - t0, stderr=err)
        st.done = bool((self.max_steps is not None and self.steps >= self.max_steps)
                       or (self.done_when is not None and self.done_when(st)))
        return st

    def checkpoint(self, name: Optional[str] = None) -> str:
        """A checkpoint of the state now (for `rollback_to`, or as a new start with `start=`)."""
        return self.sandbox.checkpoint(name).snapshot_id

    def rollback_to(self, checkpoint_id: str) -> None:
        self.sandbox.rollback(checkpoint_id)

    def fork(self, n: int, fleet: Any = None) -> List["Env"]:
        """`n` environments that continue from now, each starting its episodes here. With a
        fleet they are placed as `Fleet.fork` places them (this node first); else all here."""
        if fleet is not None:
            kids = [(node, s) for node, s in fleet.fork(self.sandbox, n).children]
        else:
            kids = []
            for c in self.sandbox.fork(n):
                if isinstance(c, BaseException):
                    for _, k in kids:
                        k.kill()
                    raise c
                kids.append((self.node, c))
        return [Env(s, max_steps=self.max_steps, done_when=self.done_when, node=node) for node, s in kids]

    def close(self) -> None:
        """Destroys the sandbox (its connection pool stays open for its forks, which share it)."""
        self.sandbox.kill()

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: A policy: (the last observation, step number) -> the next action.
Policy = Callable[[str, int], str]


class Script:
    """A policy that plays the same actions in order, whatever it observes (for smoke runs and
    tests: two episodes of it from the same start state see the same observations)."""

    def __init__(self, actions: Sequence[str]) -> None:
        self.actions = list(actions)

    def __call__(self, observation: str, step: int) -> str:
        return self.actions[step % len(self.actions)]


@dataclass
class Episode:
    node: str
    index: int
    observations: List[str]
    exit_codes: List[int]
    reset_s: Optional[float]


@dataclass
class EpisodeReport:
    episodes: List[Episode] = field(default_factory=list)
    #: Seconds each `reset()` took (every episode but each node's first).
    reset_s: List[float] = field(default_factory=list)
    #: Seconds each node took to create its environment (a new sandbox and the start checkpoint).
    create_s: List[float] = field(default_factory=list)

    @property
    def reset_p50(self) -> Optional[float]:
        return statistics.median(self.reset_s) if self.reset_s else None


def _episodes_on_node(namespace: str, node: str, indexes: List[int], policy: Policy, snapshot_id: Optional[str],
                      setup: Sequence[str], max_steps: int) -> Dict[str, Any]:
    from .fleet import Fleet

    fleet = Fleet(namespace)
    t0 = time.monotonic()
    env = Env.create(fleet, snapshot_id=snapshot_id, node=node, setup=setup, max_steps=max_steps)
    create_s = time.monotonic() - t0
    out: List[Dict[str, Any]] = []
    try:
        for k, i in enumerate(indexes):
            reset_s = None
            if k > 0:
                t = time.monotonic()
                env.reset()
                reset_s = time.monotonic() - t
            obs, codes, last = [], [], ""
            for s in range(max_steps):
                st = env.step(policy(last, s))
                obs.append(st.observation)
                codes.append(st.exit_code)
                last = st.observation
                if st.done:
                    break
            out.append({"node": node, "index": i, "observations": obs, "exit_codes": codes, "reset_s": reset_s})
    finally:
        env.close()
    return {"episodes": out, "create_s": create_s}


def run_episodes(fleet: Any, n: int, policy: Policy, snapshot: Union[None, str, Dict[str, str]] = None,
                 nodes: Optional[Sequence[str]] = None, setup: Sequence[str] = (), max_steps: int = 4,
                 timeout: float = 900) -> EpisodeReport:
    """Runs `n` episodes of `policy`, spread evenly over `nodes` (else every alive node), one Ray
    task per node pinned there by its label. Each task makes one environment, from `snapshot`
    (one snapshot id the node holds, or a map of node to snapshot id, as `Fleet.pull` gives) and
    then `setup`, and runs its episodes one after another with `reset()` between them."""
    import ray

    names = list(nodes) if nodes is not None else [x.name for x in fleet.nodes() if x.state == "alive"]
    if not names:
        raise ValueError("no node to run episodes on")
    share: Dict[str, List[int]] = {name: [] for name in names}
    for i in range(n):
        share[names[i % len(names)]].append(i)
    task = ray.remote(_episodes_on_node)
    refs = []
    for name, idx in share.items():
        if not idx:
            continue
        snap = snapshot.get(name) if isinstance(snapshot, dict) else snapshot
        refs.append(task.options(num_cpus=0, label_selector={NODE_LABEL: name}, max_retries=0)
                    .remote(fleet.namespace, name, idx, policy, snap, list(setup), max_steps))
    report = EpisodeReport()
    for part in ray.get(refs, timeout=timeout):
        report.create_s.append(part["create_s"])
        for e in part["episodes"]:
            report.episodes.append(Episode(e["node"], e["index"], e["observations"], e["exit_codes"], e["reset_s"]))
            if e["reset_s"] is not None:
                report.reset_s.append(e["reset_s"])
    report.episodes.sort(key=lambda e: e.index)
    return report
