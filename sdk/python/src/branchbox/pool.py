"""Warm pools: ready sandboxes of a snapshot (or template), refilled by the service, handed out
by `Pool.claim` / `Sandbox.claim` in milliseconds (docs/pools.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _api
from ._claim import ClaimInfo, _pool_path, claim_call, claimed
from ._config import ConnectionConfig
from ._http import _Http
from ._names import check_name
from .sandbox import Sandbox

__all__ = ["ClaimInfo", "Pool", "PoolInfo"]


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
        c = claim_call(self.name, envs, metadata, files, timeout, on_timeout, wait, allow_cold)
        return claimed(Sandbox, self._http, self._http.call(c).json())

    def close(self) -> None:
        """Closes the connection pool (the pool stays on the service)."""
        self._http.client.close()
