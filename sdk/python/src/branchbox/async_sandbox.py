"""The asynchronous client: `AsyncSandbox`, the same surface as `Sandbox` with awaitables."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Union

import httpx

from . import _api, _claim, _compat, _follow, _udp
from ._compat import SandboxPaginator, class_or_instance
from ._streams import AsyncByteStream
from ._config import ConnectionConfig
from ._pty import AsyncPty
from ._udp import AsyncUdpRelay
from .exceptions import (BranchboxError, InvalidArgumentError, NotFoundError, ServiceUnavailableError, TimeoutException,
                         from_response)
from ._claim import ClaimInfo
from .models import (CommandResult, EntryInfo, FilesystemEvent, GcReport, Lineage, NetworkInfo, ProcessInfo, SandboxInfo,
                     SandboxMetrics, SnapshotInfo, WriteInfo)


class _AsyncHttp:
    """One async connection pool to the service."""

    def __init__(self, cfg: ConnectionConfig) -> None:
        self.cfg = cfg
        self.client = httpx.AsyncClient(base_url=cfg.api_url, headers=cfg.headers(), timeout=cfg.request_timeout)

    def _request(self, c: _api.Call) -> httpx.Request:
        timeout = c.timeout if c.timeout is not None else self.cfg.request_timeout
        return self.client.build_request(
            c.method, c.path, json=c.json, params=c.params, content=c.content, headers=c.headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    async def call(self, c: _api.Call) -> httpx.Response:
        try:
            try:
                r = await self.client.send(self._request(c))
            except httpx.RemoteProtocolError:
                # See the sync client: a reused connection the service had closed.
                if c.method not in _api.IDEMPOTENT:
                    raise
                r = await self.client.send(self._request(c))
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} did not answer in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"cannot reach the branchbox service at {self.cfg.api_url}: {e}") from e
        _api.raise_for(r)
        return r

    @asynccontextmanager
    async def stream(self, c: _api.Call) -> AsyncIterator[httpx.Response]:
        try:
            r = await self.client.send(self._request(c), stream=True)
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} did not answer in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"cannot reach the branchbox service at {self.cfg.api_url}: {e}") from e
        try:
            if r.status_code >= 400:
                await r.aread()
                _api.raise_for(r)
            yield r
        except httpx.TimeoutException as e:
            raise TimeoutException(f"{c.method} {c.path} stopped sending in time: {e}") from e
        except httpx.TransportError as e:
            raise ServiceUnavailableError(f"the connection to {self.cfg.api_url} broke: {e}") from e
        finally:
            await r.aclose()


class AsyncCommandHandle:
    """A background process: from `commands.run(..., background=True)` or `commands.connect(pid)`;
    as `CommandHandle` (callbacks may be coroutine functions; a task reads the output)."""

    def __init__(self, sandbox: "AsyncSandbox", pid: int, cmd: Union[str, Sequence[str]],
                 follower: Optional[_follow.AsyncOutputFollower] = None, reap: bool = True) -> None:
        self._sandbox, self.pid, self._cmd = sandbox, pid, cmd
        self._follower = follower
        self._reap = reap

    async def _service_wait(self, timeout: Optional[float]) -> CommandResult:
        c = _api.Call("POST", _api.sandbox_path(self._sandbox.sandbox_id, f"/processes/{self.pid}/wait"),
                      json={"timeout": timeout}, timeout=_api.command_http_timeout(timeout))
        d = (await self._sandbox._http.call(c)).json()
        if d["running"]:
            raise TimeoutException(f"process {self.pid} was still running after {timeout} s")
        return CommandResult.parse(d["result"])

    async def wait(self, timeout: Optional[float] = 60.0, on_stdout: Optional[Callable[[str], Any]] = None,
                   on_stderr: Optional[Callable[[str], Any]] = None) -> CommandResult:
        """Waits for it to exit; raises `CommandExitException` on failure, `TimeoutException` when still running."""
        if self._follower is None and (on_stdout is not None or on_stderr is not None):
            self._follower = await _follow.AsyncOutputFollower.open(self._sandbox._http, self._sandbox.sandbox_id,
                                                                    self.pid, None, None, None)
        if self._follower is None:
            return _api.check_exit(await self._service_wait(timeout), self._cmd)
        await self._follower.set_callbacks(on_stdout, on_stderr)
        result = await self._follower.wait(timeout)
        if self._reap:
            try:
                result = await self._service_wait(10.0)
            except NotFoundError:
                pass
        return _api.check_exit(result, self._cmd)

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to its stdin (it was started with `stdin=True` or a text)."""
        await self._sandbox.commands.send_stdin(self.pid, data)

    async def close_stdin(self) -> None:
        """Closes its stdin: it reads end of file."""
        await self._sandbox.commands.close_stdin(self.pid)

    async def disconnect(self) -> None:
        """Stops following its output; the process runs on."""
        if self._follower is not None:
            await self._follower.close()

    async def kill(self) -> bool:
        """Kills it (SIGKILL); False when it no longer exists."""
        return await self._sandbox.commands.kill(self.pid)


class AsyncCommands:
    """Commands in one sandbox."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._s = sandbox

    async def run(
        self,
        cmd: Union[str, Sequence[str]],
        background: Optional[bool] = None,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        stdin: Union[None, bool, str] = None,
        user: Optional[str] = None,
    ) -> Any:
        """As `Sandbox.commands.run`: a `CommandResult`, or an `AsyncCommandHandle` with
        `background=True` (whose output goes to `on_stdout`/`on_stderr`, functions or coroutine
        functions, from a task as it comes)."""
        sid = self._s.sandbox_id
        user = user or self._s.default_user
        if cwd is not None:
            cwd = _compat.resolve_path(cwd, user)
        text = _follow.stdin_text(stdin)
        if background or timeout == 0:
            body = _api.command_body(cmd, envs, cwd, None, text, user)
            if timeout and stdin is None:
                body["timeout"] = timeout
            r = await self._s._http.call(_api.Call("POST", _api.sandbox_path(sid, "/processes"), json=body))
            pid = r.json()["pid"]
            follower = None
            if on_stdout is not None or on_stderr is not None or not background:
                # From the start: what it printed before the stream was open comes first.
                follower = await _follow.AsyncOutputFollower.open(self._s._http, sid, pid, on_stdout, on_stderr,
                                                                  None, replay=True)
            handle = AsyncCommandHandle(self._s, pid, cmd, follower)
            if background:
                return handle
            # E2B's timeout=0, no limit: as `Sandbox.commands.run`.
            if text is not None:
                await self.close_stdin(pid)
            return await handle.wait(timeout=None)
        body = _api.command_body(cmd, envs, cwd, timeout, text, user)
        http_timeout = _api.command_http_timeout(timeout)
        if on_stdout is None and on_stderr is None:
            c = _api.Call("POST", _api.sandbox_path(sid, "/commands"), json=body, timeout=http_timeout)
            return _api.check_exit(CommandResult.parse((await self._s._http.call(c)).json()), cmd)
        dec = _api.StreamDecoder(on_stdout, on_stderr)
        c = _api.Call("POST", _api.sandbox_path(sid, "/commands/stream"), json=body, timeout=http_timeout)
        async with self._s._http.stream(c) as r:
            async for line in r.aiter_lines():
                dec.feed_line(line)
        return _api.check_exit(dec.finish(), cmd)

    async def connect(self, pid: int, on_stdout: Optional[Callable[[str], Any]] = None,
                      on_stderr: Optional[Callable[[str], Any]] = None,
                      timeout: Optional[float] = 60.0) -> AsyncCommandHandle:
        """As `Sandbox.commands.connect`: follows a running background process's output from now on."""
        f = await _follow.AsyncOutputFollower.open(self._s._http, self._s.sandbox_id, pid, on_stdout, on_stderr,
                                                   timeout)
        return AsyncCommandHandle(self._s, int(pid), f"process {int(pid)}", f, reap=False)

    async def send_stdin(self, pid: int, data: Union[str, bytes]) -> None:
        """As `Sandbox.commands.send_stdin`."""
        await self._s._http.call(_follow.input_call(self._s.sandbox_id, pid, data))

    async def close_stdin(self, pid: int) -> None:
        """Closes a background process's stdin: it reads end of file."""
        await self._s._http.call(_follow.input_call(self._s.sandbox_id, pid, None, eof=True))

    async def list(self) -> List[ProcessInfo]:
        """Background processes."""
        r = await self._s._http.call(_api.Call("GET", _api.sandbox_path(self._s.sandbox_id, "/processes")))
        return [ProcessInfo.parse(p) for p in r.json()]

    async def send_signal(self, pid: int, signal: int, group: bool = True) -> None:
        """Sends a signal to a background process (by default to its whole process group)."""
        await self._s._http.call(_api.Call("POST", _api.sandbox_path(self._s.sandbox_id, f"/processes/{int(pid)}/signal"),
                                           json={"signal": signal, "group": group}))

    async def kill(self, pid: int) -> bool:
        """Kills a background process and its group; False when it no longer exists."""
        try:
            await self.send_signal(pid, 9)
            return True
        except NotFoundError:
            return False


class AsyncFiles:
    """Files in one sandbox; as `Sandbox.files` (relative paths under the user's home, every
    call acting as the user)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._s = sandbox

    def _path(self, rest: str = "") -> str:
        return _api.sandbox_path(self._s.sandbox_id, f"/files{rest}")

    def _abs(self, path: str, user: Optional[str]) -> str:
        return _compat.resolve_path(path, user or self._s.default_user)

    def _query(self, path: str, user: Optional[str]) -> Dict[str, Any]:
        # Every call names its account, so the service acts as it: a file call gets what the
        # account's commands would (a path they cannot read is refused here too).
        who = user or self._s.default_user
        q: Dict[str, Any] = {"path": self._abs(path, who)}
        if who:
            q["user"] = who
        return q

    async def read(self, path: str, format: str = "text", user: Optional[str] = None) -> Any:
        """As `Sandbox.files.read`; `format="stream"` gives an async iterator of byte chunks."""
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentError(f"format {format!r} is not one of 'text', 'bytes', 'stream'")
        c = _api.Call("GET", self._path(), params=self._query(path, user))
        if format == "stream":
            cm = self._s._http.stream(c)
            # Sent now, so that a missing file raises here as for the other formats.
            r = await cm.__aenter__()
            return AsyncByteStream(cm, r)
        parts = []
        async with self._s._http.stream(c) as r:
            async for chunk in r.aiter_bytes():
                parts.append(chunk)
        data = b"".join(parts)
        return data if format == "bytes" else data.decode("utf-8", "replace")

    async def write(self, path: Any, data: Any = None, mode: Optional[int] = None, user: Optional[str] = None) -> Any:
        """As `Sandbox.files.write`: one file's `WriteInfo`, or a list for a list of
        `{"path": ..., "data": ...}`."""
        many, entries = _compat.write_entries(path, data)
        out = [await self._write_one(p, d, mode, user) for p, d in entries]
        return out if many else out[0]

    async def write_files(self, files: Sequence[Mapping[str, Any]], user: Optional[str] = None) -> List[WriteInfo]:
        """Writes several files; E2B's name for a list write."""
        return await self.write(list(files), user=user)

    async def _write_one(self, path: str, data: Union[str, bytes], mode: Optional[int], user: Optional[str]) -> WriteInfo:
        owner = user or self._s.default_user
        params: Dict[str, Any] = {"path": self._abs(path, owner)}
        if owner:
            params["user"] = owner
        if mode is not None:
            params["mode"] = format(mode, "o")
        content = data.encode() if isinstance(data, str) else bytes(data)
        r = await self._s._http.call(_api.Call("PUT", self._path(), params=params, content=content,
                                               headers={"content-type": "application/octet-stream"}))
        return WriteInfo.parse(r.json())

    async def list(self, path: str, user: Optional[str] = None) -> List[EntryInfo]:
        """Entries of a directory."""
        r = await self._s._http.call(_api.Call("GET", self._path("/list"), params=self._query(path, user)))
        return [EntryInfo.parse(e) for e in r.json()]

    async def get_info(self, path: str, user: Optional[str] = None) -> EntryInfo:
        """Metadata of a path."""
        r = await self._s._http.call(_api.Call("GET", self._path("/stat"), params=self._query(path, user)))
        return EntryInfo.parse(r.json())

    async def exists(self, path: str, user: Optional[str] = None) -> bool:
        """True when the path exists."""
        try:
            await self.get_info(path, user)
            return True
        except NotFoundError:
            return False

    async def remove(self, path: str, recursive: bool = True, user: Optional[str] = None) -> None:
        """Removes a file or a directory (with its contents unless `recursive=False`)."""
        params = {**self._query(path, user), "recursive": str(recursive).lower()}
        await self._s._http.call(_api.Call("DELETE", self._path(), params=params))

    async def rename(self, old_path: str, new_path: str, user: Optional[str] = None) -> EntryInfo:
        """Renames a path; returns the renamed entry."""
        old, new = self._query(old_path, user), self._query(new_path, user)
        body = {"from": old["path"], "to": new["path"]}
        if "user" in old:
            body["user"] = old["user"]
        await self._s._http.call(_api.Call("POST", self._path("/rename"), json=body))
        return await self.get_info(new["path"], user)

    async def watch_dir(self, path: str, on_event: Callable[[FilesystemEvent], Any],
                        on_exit: Optional[Callable[[Optional[Exception]], Any]] = None, recursive: bool = False,
                        user: Optional[str] = None, timeout: Optional[float] = 60.0) -> _follow.AsyncWatchHandle:
        """Watches a directory: `on_event` (a function or coroutine function) gets each
        `FilesystemEvent` from a task, `on_exit` None or the error that ended the watch;
        `await handle.stop()` ends it. `timeout` (E2B's, default 60 s; `0`/None: none) ends it
        that long after it began."""
        return await _follow.AsyncWatchHandle.open(self._s._http, self._s.sandbox_id, self._abs(path, user),
                                                   recursive, on_event, on_exit, timeout)

    async def make_dir(self, path: str, user: Optional[str] = None) -> bool:
        """Creates a directory and its parents, owned by `user`; False when it existed already."""
        owner = user or self._s.default_user
        body: Dict[str, Any] = {"path": self._abs(path, owner), "parents": True}
        if owner:
            body["user"] = owner
        r = await self._s._http.call(_api.Call("POST", self._path("/mkdir"), json=body))
        return bool(r.json()["created"])


class AsyncSandboxPaginator(SandboxPaginator):
    """`AsyncSandbox.list()`: as `SandboxPaginator`, with `await next_items()` as in E2B's async SDK."""

    async def next_items(self) -> List[SandboxInfo]:  # type: ignore[override]
        return SandboxPaginator.next_items(self)


class AsyncSandbox:
    """A sandbox behind a branchbox service, for asyncio. Use `await AsyncSandbox.create()`."""

    def __init__(self, sandbox_id: str, http: _AsyncHttp, info: Optional[SandboxInfo] = None, *,
                 user: Optional[str] = None, template: Optional[str] = None, image: Optional[str] = None) -> None:
        self.sandbox_id = sandbox_id
        self._http = http
        self._template = template
        self._info = _compat.with_template(info, template) if info is not None else None
        #: The account commands run as and files belong to unless a call names another.
        self.default_user = _compat.default_user(user, template, image)
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        #: Terminals (E2B's `sandbox.pty`).
        self.pty = AsyncPty(self)
        #: How it was handed out, for a sandbox from `AsyncSandbox.claim` (else None).
        self.claim_info: Optional[ClaimInfo] = None

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.sandbox_id!r})"

    @classmethod
    async def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        envs: Optional[Mapping[str, str]] = None,
        backend: str = "auto",
        *,
        snapshot_id: Optional[str] = None,
        image: Optional[str] = None,
        on_timeout: str = "kill",
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        pids: Optional[int] = None,
        api_url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        api_key: Optional[str] = None,
        user: Optional[str] = None,
        allow_internet_access: Optional[bool] = None,
        network: Optional[Mapping[str, Any]] = None,
        open_ports: Optional[bool] = None,
    ) -> "AsyncSandbox":
        """As `Sandbox.create`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token), request_timeout))
        c = _api.create(_compat.template_name(template), snapshot_id, timeout, on_timeout, metadata, envs, backend,
                        memory_mib, cpus, pids, image=image, network=network,
                        allow_internet_access=allow_internet_access, open_ports=open_ports)
        info = SandboxInfo.parse((await http.call(c)).json())
        return cls(info.sandbox_id, http, info, user=user, template=template, image=image)

    @classmethod
    async def claim(
        cls,
        pool: str,
        envs: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        timeout: Optional[float] = None,
        *,
        on_timeout: Optional[str] = None,
        wait: Optional[float] = None,
        allow_cold: bool = False,
        api_url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "AsyncSandbox":
        """As `Sandbox.claim`: a ready sandbox from a warm pool, with `claim_info` saying how."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, token, request_timeout))
        c = _claim.claim_call(pool, envs, metadata, files, timeout, on_timeout, wait, allow_cold)
        return _claim.claimed(cls, http, (await http.call(c)).json())

    @classmethod
    async def connect(cls, sandbox_id: str, timeout: Optional[float] = None, *, api_url: Optional[str] = None,
                      token: Optional[str] = None, request_timeout: Optional[float] = None,
                      api_key: Optional[str] = None, user: Optional[str] = None) -> "AsyncSandbox":
        """As `Sandbox.connect`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token), request_timeout))
        body = {} if timeout is None else {"timeout": timeout}
        r = await http.call(_api.Call("POST", _api.sandbox_path(sandbox_id, "/connect"), json=body))
        info = SandboxInfo.parse(r.json())
        return cls(info.sandbox_id, http, info, user=user)

    @classmethod
    async def list(cls, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None, *,
                   query: Any = None, local: bool = False, api_url: Optional[str] = None,
                   token: Optional[str] = None, api_key: Optional[str] = None,
                   **_paging: Any) -> AsyncSandboxPaginator:
        """As `Sandbox.list` (`local`, `unanswered_peers` and `PartialListWarning` included); the
        paginator's `next_items()` is awaited."""
        metadata, state, states = _compat.list_filters(query, metadata, state)
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token)))
        try:
            r = await http.call(_api.list_sandboxes(metadata, state, local))
            return _compat.listing(AsyncSandboxPaginator, r, states)
        finally:
            await http.client.aclose()

    @classmethod
    def _by_id(cls, sandbox_id: str, api_url: Optional[str], token: Optional[str],
               api_key: Optional[str]) -> "AsyncSandbox":
        """A handle on `sandbox_id` without connecting (no resume, no timeout change)."""
        return cls(sandbox_id, _AsyncHttp(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token))))

    @classmethod
    async def push_snapshot(cls, snapshot: str, *, api_url: Optional[str] = None,
                            token: Optional[str] = None) -> Dict[str, Any]:
        """As `Sandbox.push_snapshot`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, token))
        try:
            return (await http.call(_api.push_snapshot(snapshot))).json()
        finally:
            await http.client.aclose()

    @classmethod
    async def pull_snapshot(cls, snapshot_id: str, peer: Optional[str] = None, *,
                            api_url: Optional[str] = None, token: Optional[str] = None) -> Dict[str, Any]:
        """As `Sandbox.pull_snapshot`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, token))
        try:
            return (await http.call(_api.pull_snapshot(snapshot_id, peer))).json()
        finally:
            await http.client.aclose()

    @classmethod
    async def fleet_capacity(cls, *, api_url: Optional[str] = None, token: Optional[str] = None) -> Dict[str, int]:
        """As `Sandbox.fleet_capacity`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, token))
        try:
            return (await http.call(_api.fleet_capacity())).json()
        finally:
            await http.client.aclose()

    @classmethod
    async def gc(cls, dry_run: bool = False, *, api_url: Optional[str] = None,
                 token: Optional[str] = None) -> GcReport:
        """As `Sandbox.gc`."""
        http = _AsyncHttp(ConnectionConfig.resolve(api_url, token))
        try:
            return GcReport.parse((await http.call(_api.gc(dry_run))).json())
        finally:
            await http.client.aclose()

    @class_or_instance
    async def get_info(self) -> SandboxInfo:
        """The sandbox's state, metadata and timeout now; also `await AsyncSandbox.get_info(sandbox_id)`."""
        info = SandboxInfo.parse((await self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id)))).json())
        self._info = _compat.with_template(info, self._template)
        return self._info

    @get_info.on_class
    async def _get_info_by_id(cls, sandbox_id: str, *, api_url: Optional[str] = None, token: Optional[str] = None,
                              api_key: Optional[str] = None) -> SandboxInfo:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            return await s.get_info()
        finally:
            await s.close()

    async def get_host(self, port: int) -> str:
        """As `Sandbox.get_host`."""
        return (await self._http.call(_api.Call("GET", _api.host_path(self.sandbox_id, port)))).json()["address"]

    def proxy_url(self, port: int) -> str:
        """As `Sandbox.proxy_url`."""
        _api.host_path(self.sandbox_id, port)
        return f"{self._http.cfg.api_url}{_api.sandbox_path(self.sandbox_id, f'/ports/{port}/')}"

    async def udp(self, port: int, request_timeout: Optional[float] = None) -> AsyncUdpRelay:
        """As `Sandbox.udp`: `relay = await sbx.udp(port)`, then `await relay.send(data)`,
        `await relay.recv(timeout)`; `async with` closes it."""
        return await _udp.open_async_relay(self, port, request_timeout)

    async def get_network(self) -> NetworkInfo:
        """As `Sandbox.get_network`."""
        c = _api.Call("GET", _api.sandbox_path(self.sandbox_id, "/network"))
        return NetworkInfo.parse((await self._http.call(c)).json())

    async def set_network(self, mode: str, allow: Optional[Sequence[str]] = None) -> NetworkInfo:
        """As `Sandbox.set_network`."""
        c = _api.Call("PUT", _api.sandbox_path(self.sandbox_id, "/network"), json=_api.network_policy(mode, allow))
        return NetworkInfo.parse((await self._http.call(c)).json())

    async def get_metrics(self) -> List[SandboxMetrics]:
        """As `Sandbox.get_metrics`."""
        h = await self.commands.run(["/bin/sh", "-c", _compat.METRICS_SCRIPT], background=True, user="root", timeout=30)
        return [_compat.parse_metrics((await h.wait(timeout=30)).stdout)]

    async def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """As `Sandbox.is_running`."""
        c = _api.Call("GET", _api.sandbox_path(self.sandbox_id), timeout=request_timeout)
        try:
            return SandboxInfo.parse((await self._http.call(c)).json()).state == "running"
        except NotFoundError:
            return False

    @class_or_instance
    async def kill(self) -> bool:
        """Destroys the sandbox; False when it was already gone. Also `await AsyncSandbox.kill(sandbox_id)`."""
        try:
            await self._http.call(_api.Call("DELETE", _api.sandbox_path(self.sandbox_id)))
            return True
        except NotFoundError:
            return False

    @kill.on_class
    async def _kill_by_id(cls, sandbox_id: str, *, api_url: Optional[str] = None, token: Optional[str] = None,
                          api_key: Optional[str] = None) -> bool:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            return await s.kill()
        finally:
            await s.close()

    async def pause(self) -> SandboxInfo:
        """Pauses it; `AsyncSandbox.connect(id)` resumes it."""
        r = await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/pause")))
        return SandboxInfo.parse(r.json())

    async def resume(self, timeout: Optional[float] = None) -> SandboxInfo:
        """Resumes a paused sandbox and restarts its timeout."""
        body = {} if timeout is None else {"timeout": timeout}
        r = await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/connect"), json=body))
        return SandboxInfo.parse(r.json())

    @class_or_instance
    async def set_timeout(self, timeout: float) -> None:
        """Sets the timeout to `timeout` seconds from now; also `await AsyncSandbox.set_timeout(sandbox_id, timeout)`."""
        await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/timeout"), json={"timeout": timeout}))

    @set_timeout.on_class
    async def _set_timeout_by_id(cls, sandbox_id: str, timeout: float, *, api_url: Optional[str] = None,
                                 token: Optional[str] = None, api_key: Optional[str] = None) -> None:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            await s.set_timeout(timeout)
        finally:
            await s.close()

    async def set_history(self, enabled: bool = True) -> None:
        """Step-history mode: every command ends with a checkpoint (``CommandResult.checkpoint``)."""
        await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/history"), json={"enabled": enabled}))

    async def fork(self, count: int = 1) -> List[Union["AsyncSandbox", BranchboxError]]:
        """Forks `count` children; one AsyncSandbox or exception per child."""
        r = await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/fork"), json={"count": count}))
        out: List[Union[AsyncSandbox, BranchboxError]] = []
        for c in r.json()["children"]:
            if c["ok"]:
                info = SandboxInfo.parse(c["sandbox"])
                out.append(type(self)(info.sandbox_id, self._http, info, user=self.default_user, template=self._template))
            else:
                err = c.get("error") or {}
                out.append(from_response(500, err.get("code"), err.get("message", "the child did not start")))
        return out

    async def create_snapshot(self, name: Optional[str] = None) -> SnapshotInfo:
        """Captures the full state; the sandbox keeps running."""
        body = _api.snapshot_body(name)
        r = await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/snapshots"), json=body))
        return SnapshotInfo.parse(r.json())

    async def checkpoint(self, name: Optional[str] = None) -> SnapshotInfo:
        """Takes a checkpoint to roll back to later."""
        body = _api.snapshot_body(name)
        r = await self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/checkpoints"), json=body))
        return SnapshotInfo.parse(r.json())

    async def checkpoints(self) -> List[SnapshotInfo]:
        """This sandbox's checkpoints, oldest first."""
        r = await self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id, "/checkpoints")))
        return [SnapshotInfo.parse(d) for d in r.json()]

    async def rollback(self, checkpoint_id: str) -> SandboxInfo:
        """Returns this sandbox, in place, to a checkpoint."""
        c = _api.rollback(self.sandbox_id, checkpoint_id)
        return SandboxInfo.parse((await self._http.call(c)).json())

    async def lineage(self) -> Lineage:
        """The part of the lineage connected to this sandbox."""
        r = await self._http.call(_api.Call("GET", "/v1/lineage", params={"sandbox": self.sandbox_id}))
        return Lineage.parse(r.json())

    async def close(self) -> None:
        """Closes the connection pool (the sandbox keeps running)."""
        await self._http.client.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()
