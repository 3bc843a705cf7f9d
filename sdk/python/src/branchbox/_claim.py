"""Claiming a sandbox from a warm pool, for `Pool.claim`, `Sandbox.claim` and
`AsyncSandbox.claim` alike: the request, and the sandbox its answer hands out."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _api
from ._names import check_name


@dataclass(frozen=True)
class ClaimInfo:
    """How a claimed sandbox was handed out."""

    #: "pool": a ready sandbox; "cold": started at claim time (only with `allow_cold=True`).
    source: str
    pool: str
    #: Seconds spent waiting for the pool to hold a ready sandbox.
    waited: float
    #: What the after-fork hook did at claim time, per step ("applied", or why not).
    identity: Dict[str, str]


def _pool_path(name: str, rest: str = "") -> str:
    check_name("pool name", name)
    return f"/v1/pools/{_api._q(name)}{rest}"


def _files_body(files: Optional[Mapping[str, Union[str, bytes]]]) -> Optional[List[Dict[str, str]]]:
    if files is None:
        return None
    out = []
    for path, content in files.items():
        if isinstance(content, bytes):
            out.append({"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"})
        else:
            out.append({"path": path, "content": content})
    return out


def claim_call(
    pool: str,
    envs: Optional[Mapping[str, str]],
    metadata: Optional[Mapping[str, str]],
    files: Optional[Mapping[str, Union[str, bytes]]],
    timeout: Optional[float],
    on_timeout: Optional[str],
    wait: Optional[float],
    allow_cold: bool,
) -> _api.Call:
    body = {
        "envs": dict(envs) if envs is not None else None,
        "metadata": dict(metadata) if metadata is not None else None,
        "files": _files_body(files),
        "timeout": timeout,
        "on_timeout": on_timeout,
        "wait": wait,
        "allow_cold": allow_cold or None,
    }
    # The HTTP request outlives the claim's own wait.
    http_timeout = None if wait is None else wait + 60.0
    return _api.Call("POST", _pool_path(pool, "/claim"), json=_api.compact(body),
                     timeout=http_timeout)


def claimed(cls: Any, http: Any, d: Dict[str, Any]) -> Any:
    """The sandbox a claim's answer hands out, as a `cls` (`Sandbox` or `AsyncSandbox`) on
    `http`, with `claim_info` saying how it was handed out."""
    from .models import SandboxInfo

    info = SandboxInfo.parse(d["sandbox"])
    s = cls(info.sandbox_id, http, info)
    s.claim_info = ClaimInfo(source=d["source"], pool=d["pool"], waited=d.get("waited_ms", 0) / 1000,
                             identity=dict(d.get("identity") or {}))
    return s
