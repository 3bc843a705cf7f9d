"""The synchronous transport: one httpx connection pool to the service, shared by a sandbox,
the children it forks, its pools and templates. It sends the calls `_api` describes and turns
transport failures into the SDK's exceptions."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import httpx

from . import _api
from ._config import ConnectionConfig
from .exceptions import ServiceUnavailableError, TimeoutException


class _Http:
    """One connection pool to the service, shared by a sandbox and the children it forks."""

    def __init__(self, cfg: ConnectionConfig) -> None:
        self.cfg = cfg
        self.client = httpx.Client(base_url=cfg.api_url, headers=cfg.headers(), timeout=cfg.request_timeout)

    def _request(self, c: _api.Call) -> httpx.Request:
        timeout = c.timeout if c.timeout is not None else self.cfg.request_timeout
        return self.client.build_request(
            c.method, c.path, json=c.json, params=c.params, content=c.content, headers=c.headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def call(self, c: _api.Call) -> httpx.Response:
        try:
            try:
                r = self.client.send(self._request(c))
            except httpx.RemoteProtocolError:
                # A pooled keep-alive connection the service closed as it was reused: an
                # idempotent request is sent once more on a fresh one.
                if c.method not in _api.IDEMPOTENT:
                    raise
                r = self.client.send(self._request(c))
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} did not answer in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"cannot reach the branchbox service at {self.cfg.api_url}: {e}") from e
        _api.raise_for(r)
        return r

    @contextmanager
    def stream(self, c: _api.Call) -> Iterator[httpx.Response]:
        try:
            r = self.client.send(self._request(c), stream=True)
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} did not answer in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"cannot reach the branchbox service at {self.cfg.api_url}: {e}") from e
        try:
            if r.status_code >= 400:
                r.read()
                _api.raise_for(r)
            yield r
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} stopped sending in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"the connection to {self.cfg.api_url} broke: {e}") from e
        finally:
            r.close()
