"""branchbox on a Ray cluster (`pip install branchbox[ray]`; docs/fleet.md).

One node actor per Ray node runs and supervises that node's branchboxd; a detached directory
actor knows where each sandbox runs and which node holds which pushed snapshot; `Fleet` places
sandboxes, routes calls to the owning node through the ordinary `branchbox.Sandbox`, and forks
across nodes (`branchbox remote push/pull`: one push to S3, one pull per node from the source
node's branchboxd first and S3 second). `branchbox.fleet.rl` is an RL environment API on top.
"""

from .cluster import NODE_LABEL, LocalCluster, node_name
from .directory import DIRECTORY_NAME, NAMESPACE, Directory
from .fleet import Fleet, ForkResult, LostSandboxError, NodeInfo, SandboxRoute, cross_node_missing
from .node import Node

__all__ = [
    "DIRECTORY_NAME",
    "Directory",
    "Fleet",
    "ForkResult",
    "LocalCluster",
    "LostSandboxError",
    "NAMESPACE",
    "NODE_LABEL",
    "Node",
    "NodeInfo",
    "SandboxRoute",
    "cross_node_missing",
    "node_name",
]
