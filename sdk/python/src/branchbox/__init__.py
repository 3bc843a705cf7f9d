"""branchbox: sandboxes for AI agents that fork, snapshot, checkpoint and roll back.

`Sandbox` is the synchronous client, `AsyncSandbox` the asyncio one; both talk to a running
`branchboxd` over HTTP (settings from arguments, `BRANCHBOX_URL`/`BRANCHBOX_TOKEN`, or the
service's files in the data directory).
"""

from .async_sandbox import AsyncCommandHandle, AsyncSandbox, AsyncSandboxPaginator
from ._compat import SandboxPaginator
from ._follow import AsyncWatchHandle, WatchHandle
from ._streams import AsyncByteStream, ByteStream
from ._pty import AsyncPty, AsyncPtyHandle, Pty, PtyHandle, PtySize
from ._udp import AsyncUdpRelay, UdpRelay
from ._names import MAX_NAME_BYTES, check_name
from .exceptions import (
    AuthenticationError,
    BranchboxError,
    CapacityError,
    CommandExitException,
    CommandTimeoutException,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PartialListWarning,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    ServiceUnavailableError,
    TimeoutException,
)
from .models import (CommandResult, EntryInfo, FilesystemEvent, FilesystemEventType, GcReport, Lineage, NetworkInfo,
                     ProcessInfo, SandboxInfo, SandboxMetrics, SnapshotInfo, WriteInfo)
from .sandbox import CommandHandle, Sandbox
from .templates import TemplateInfo, Templates
from .pool import ClaimInfo, Pool, PoolInfo

__all__ = [
    "AsyncCommandHandle",
    "AsyncByteStream",
    "AsyncSandbox",
    "AsyncSandboxPaginator",
    "AsyncWatchHandle",
    "AsyncPty",
    "AsyncPtyHandle",
    "AsyncUdpRelay",
    "AuthenticationError",
    "ClaimInfo",
    "Pool",
    "PoolInfo",
    "BranchboxError",
    "CapacityError",
    "ByteStream",
    "CommandExitException",
    "CommandTimeoutException",
    "CommandHandle",
    "CommandResult",
    "ConflictError",
    "EntryInfo",
    "FilesystemEvent",
    "FilesystemEventType",
    "GcReport",
    "InvalidArgumentError",
    "Lineage",
    "NetworkInfo",
    "NotFoundError",
    "PartialListWarning",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProcessInfo",
    "Pty",
    "PtyHandle",
    "PtySize",
    "Sandbox",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxPaginator",
    "ServerError",
    "ServiceUnavailableError",
    "SnapshotInfo",
    "TemplateInfo",
    "Templates",
    "TimeoutException",
    "UdpRelay",
    "WatchHandle",
    "WriteInfo",
    "MAX_NAME_BYTES",
    "check_name",
]
