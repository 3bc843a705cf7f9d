"""Warm pools: ready sandboxes of a snapshot (or template), refilled by the service, handed out
by `Pool.claim` / `Sandbox.claim` in milliseconds (docs/pools.md)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

from . import _api
from ._config import ConnectionConfig
from ._names import check_name

if TYPE_CHECKING:
    from .sandbox import Sandbox, _Http


@dataclass(frozen=True)
class PoolInfo:
    """A pool and how full it is."""

    name: str
    snapshot: Optional[str]
    template: Optional[str]
    size: int
    paused: bool
    max_idle: float
    ready: int
    #: Ids of the ready sandboxes, oldest first.
    members: List[str]
    memory_bytes: Optional[int]
    claims_pool: int
    claims_cold: int
    last_error: Optional[str]

    @staticmethod
    def parse(d: Dict[str, Any]) -> "PoolInfo":
        return PoolInfo(
            name=d["name"],
            snapshot=d.get("snapshot"),
            template=d.get("template"),
            size=int(d["size"]),
            paused=bool(d.get("paused", False)),
            max_idle=d["max_idle_ms"] / 1000,
            ready=int(d.get("ready", 0)),
            members=list(d.get("members") or []),
            memory_bytes=d.get("memory_bytes"),
            claims_pool=int(d.get("claims_pool", 0)),
            claims_cold=int(d.get("claims_cold", 0)),
            last_error=d.get("last_error"),
        )


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


class Pool:
    """A warm pool on the service. `Pool.create(...)` makes one; `pool.claim(...)` hands out a sandbox."""

    def __init__(self, name: str, http: "_Http", info: Optional[PoolInfo] = None) -> None:
        self.name = name
        self._http = http
        self._info = info

    def __repr__(self) -> str:
        return f"Pool({self.name!r})"

    @staticmethod
    def _connect(api_url: Optional[str], token: Optional[str], request_timeout: Optional[float] = None) -> "_Http":
        from .sandbox import _Http

        return _Http(ConnectionConfig.resolve(api_url, token, request_timeout))

    @classmethod
    def create(
        cls,
        name: str,
        size: int,
        *,
        snapshot: Optional[str] = None,
        template: Optional[str] = None,
        max_idle: Optional[float] = None,
        paused: bool = False,
        api_url: Optional[str] = None,
        token: Optional[str] = None,
    ) -> "Pool":
        """Creates a pool of `size` ready sandboxes restored from `snapshot` (or `template`);
        sandboxes ready for longer than `max_idle` seconds are replaced. The service fills it
        in the background."""
        check_name("pool name", name)
        body = {"name": name, "size": size, "snapshot": snapshot, "template": template, "max_idle": max_idle,
                "paused": paused}
        http = cls._connect(api_url, token)
        d = http.call(_api.Call("POST", "/v1/pools", json=_api.compact(body))).json()
        return cls(name, http, PoolInfo.parse(d))

    @classmethod
    def connect(cls, name: str, *, api_url: Optional[str] = None, token: Optional[str] = None) -> "Pool":
        """An existing pool."""
        http = cls._connect(api_url, token)
        return cls(name, http, PoolInfo.parse(http.call(_api.Call("GET", _pool_path(name))).json()))

    @classmethod
    def list(cls, *, api_url: Optional[str] = None, token: Optional[str] = None) -> List[PoolInfo]:
        """Every pool."""
        http = cls._connect(api_url, token)
        try:
            return [PoolInfo.parse(d) for d in http.call(_api.Call("GET", "/v1/pools")).json()]
        finally:
            http.client.close()

    def get_info(self) -> PoolInfo:
        """Its definition and how full it is now."""
        self._info = PoolInfo.parse(self._http.call(_api.Call("GET", _pool_path(self.name))).json())
        return self._info

    def update(self, size: Optional[int] = None, max_idle: Optional[float] = None) -> PoolInfo:
        """Changes the pool's size or idle age (what is left out stays). A smaller size destroys
        the oldest ready sandboxes beyond it at once (claimed ones stay); a larger one starts a
        refill. Bad values raise `InvalidArgumentError` and change nothing."""
        body = {"size": size, "max_idle": max_idle}
        d = self._http.call(_api.Call("PATCH", _pool_path(self.name), json=_api.compact(body)))
        self._info = PoolInfo.parse(d.json())
        return self._info

    def delete(self) -> None:
        """Deletes the pool and destroys its ready sandboxes (claimed ones stay)."""
        self._http.call(_api.Call("DELETE", _pool_path(self.name)))

    def claim(
        self,
        envs: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        timeout: Optional[float] = None,
        *,
        on_timeout: Optional[str] = None,
        wait: Optional[float] = None,
        allow_cold: bool = False,
    ) -> "Sandbox":
        """A ready sandbox with a fresh identity and the given env, metadata and files
        (path -> text or bytes). An empty pool is waited on up to `wait` seconds (the service's
        default is 30), then `ServiceUnavailableError` (code `pool_empty`); with
        `allow_cold=True` a sandbox is started at once instead, and `sandbox.claim_info.source`
        says "cold"."""
        from .sandbox import Sandbox

        c = claim_call(self.name, envs, metadata, files, timeout, on_timeout, wait, allow_cold)
        return claimed(Sandbox, self._http, self._http.call(c).json())

    def close(self) -> None:
        """Closes the connection pool (the pool stays on the service)."""
        self._http.client.close()
