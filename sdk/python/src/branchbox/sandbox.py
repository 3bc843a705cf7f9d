"""The synchronous client: `Sandbox`, with `commands` and `files`."""

from __future__ import annotations

from contextlib import contextmanager
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union, overload

import httpx

from . import _api
from . import pool as _pool
from ._config import ConnectionConfig
from .exceptions import BranchboxError, NotFoundError, ServiceUnavailableError, TimeoutException, from_response
from .pool import ClaimInfo
from .models import CommandResult, EntryInfo, GcReport, Lineage, ProcessInfo, SandboxInfo, SnapshotInfo, WriteInfo

#: How much of a file upload is sent per chunk.
UPLOAD_CHUNK = 256 * 1024


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


class CommandHandle:
    """A background process started with `commands.run(..., background=True)`."""

    def __init__(self, sandbox: "Sandbox", pid: int, cmd: Union[str, Sequence[str]]) -> None:
        self._sandbox, self.pid, self._cmd = sandbox, pid, cmd

    def wait(self, timeout: Optional[float] = 60.0) -> CommandResult:
        """Waits for it to exit; raises `CommandExitException` on failure, `TimeoutException` when still running."""
        c = _api.Call("POST", _api.sandbox_path(self._sandbox.sandbox_id, f"/processes/{self.pid}/wait"),
                      json={"timeout": timeout}, timeout=_api.command_http_timeout(timeout))
        d = self._sandbox._http.call(c).json()
        if d["running"]:
            raise TimeoutException(f"process {self.pid} was still running after {timeout} s")
        return _api.check_exit(CommandResult.parse(d["result"]), self._cmd)

    def kill(self) -> bool:
        """Kills it (SIGKILL); False when it no longer exists."""
        return self._sandbox.commands.kill(self.pid)


class Commands:
    """Commands in one sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._s = sandbox

    @overload
    def run(self, cmd: Union[str, Sequence[str]], background: None = None, envs: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, timeout: Optional[float] = 60.0, on_stdout: Optional[Callable[[str], Any]] = None,
            on_stderr: Optional[Callable[[str], Any]] = None, stdin: Optional[str] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: Union[str, Sequence[str]], background: bool = ..., envs: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, timeout: Optional[float] = 60.0, on_stdout: Optional[Callable[[str], Any]] = None,
            on_stderr: Optional[Callable[[str], Any]] = None, stdin: Optional[str] = None) -> Union[CommandResult, CommandHandle]: ...

    def run(self, cmd, background=None, envs=None, cwd=None, timeout=60.0, on_stdout=None, on_stderr=None, stdin=None):
        """Runs `cmd` (a shell line, or an argv list) and returns its result; raises
        `CommandExitException` when it fails. With `on_stdout`/`on_stderr` the output streams to
        the callbacks as it is produced; with `background=True` it returns a `CommandHandle`."""
        sid = self._s.sandbox_id
        if background:
            body = _api.command_body(cmd, envs, cwd, None, None)
            if timeout is not None and stdin is None:
                body["timeout"] = timeout
            pid = self._s._http.call(_api.Call("POST", _api.sandbox_path(sid, "/processes"), json=body)).json()["pid"]
            return CommandHandle(self._s, pid, cmd)
        body = _api.command_body(cmd, envs, cwd, timeout, stdin)
        http_timeout = _api.command_http_timeout(timeout)
        if on_stdout is None and on_stderr is None:
            c = _api.Call("POST", _api.sandbox_path(sid, "/commands"), json=body, timeout=http_timeout)
            return _api.check_exit(CommandResult.parse(self._s._http.call(c).json()), cmd)
        dec = _api.StreamDecoder(on_stdout, on_stderr)
        c = _api.Call("POST", _api.sandbox_path(sid, "/commands/stream"), json=body, timeout=http_timeout)
        with self._s._http.stream(c) as r:
            for line in r.iter_lines():
                dec.feed_line(line)
        return _api.check_exit(dec.finish(), cmd)

    def list(self) -> List[ProcessInfo]:
        """Background processes."""
        r = self._s._http.call(_api.Call("GET", _api.sandbox_path(self._s.sandbox_id, "/processes")))
        return [ProcessInfo.parse(p) for p in r.json()]

    def send_signal(self, pid: int, signal: int, group: bool = True) -> None:
        """Sends a signal to a background process (by default to its whole process group)."""
        self._s._http.call(_api.Call("POST", _api.sandbox_path(self._s.sandbox_id, f"/processes/{int(pid)}/signal"),
                                     json={"signal": signal, "group": group}))

    def kill(self, pid: int) -> bool:
        """Kills a background process and its group; False when it no longer exists."""
        try:
            self.send_signal(pid, 9)
            return True
        except NotFoundError:
            return False


class Files:
    """Files in one sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._s = sandbox

    def _path(self, rest: str = "") -> str:
        return _api.sandbox_path(self._s.sandbox_id, f"/files{rest}")

    @overload
    def read(self, path: str, format: str = "text") -> str: ...

    @overload
    def read(self, path: str, format: str = "bytes") -> bytes: ...

    def read(self, path: str, format: str = "text") -> Union[str, bytes]:
        """Reads a file as text (UTF-8) or, with `format="bytes"`, as bytes; streamed."""
        with self._s._http.stream(_api.Call("GET", self._path(), params={"path": path})) as r:
            data = b"".join(r.iter_bytes())
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def write(self, path: str, data: Union[str, bytes, IO[bytes]], mode: Optional[int] = None) -> WriteInfo:
        """Writes a file (replacing it atomically); creates missing parent directories."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        if isinstance(data, str):
            content: Any = data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        else:
            src = data
            content = iter(lambda: src.read(UPLOAD_CHUNK), b"")
        r = self._s._http.call(_api.Call("PUT", self._path(), params=params, content=content,
                                         headers={"content-type": "application/octet-stream"}))
        d = r.json()
        return WriteInfo(d["path"], int(d["size"]))

    def list(self, path: str) -> List[EntryInfo]:
        """Entries of a directory."""
        r = self._s._http.call(_api.Call("GET", self._path("/list"), params={"path": path}))
        return [EntryInfo.parse(e) for e in r.json()]

    def get_info(self, path: str) -> EntryInfo:
        """Metadata of a path."""
        return EntryInfo.parse(self._s._http.call(_api.Call("GET", self._path("/stat"), params={"path": path})).json())

    def exists(self, path: str) -> bool:
        """True when the path exists."""
        try:
            self.get_info(path)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, recursive: bool = True) -> None:
        """Removes a file or a directory (with its contents unless `recursive=False`)."""
        self._s._http.call(_api.Call("DELETE", self._path(), params={"path": path, "recursive": str(recursive).lower()}))

    def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Renames a path; returns the renamed entry."""
        self._s._http.call(_api.Call("POST", self._path("/rename"), json={"from": old_path, "to": new_path}))
        return self.get_info(new_path)

    def make_dir(self, path: str) -> bool:
        """Creates a directory and its parents; False when it existed already."""
        r = self._s._http.call(_api.Call("POST", self._path("/mkdir"), json={"path": path, "parents": True}))
        return bool(r.json()["created"])


class Sandbox:
    """A sandbox behind a branchbox service. Use `Sandbox.create()` or `Sandbox.connect()`."""

    def __init__(self, sandbox_id: str, http: _Http, info: Optional[SandboxInfo] = None) -> None:
        self.sandbox_id = sandbox_id
        self._http = http
        self._info = info
        self.commands = Commands(self)
        self.files = Files(self)
        #: How it was handed out, for a sandbox from `Sandbox.claim` (else None).
        self.claim_info: Optional[ClaimInfo] = None

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r})"

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        metadata: Optional[Mapping[str, str]] = None,
        envs: Optional[Mapping[str, str]] = None,
        backend: str = "auto",
        *,
        snapshot_id: Optional[str] = None,
        on_timeout: str = "kill",
        memory_mib: Optional[int] = None,
        cpus: Optional[int] = None,
        pids: Optional[int] = None,
        api_url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Sandbox":
        """Starts a sandbox from the template (or from `snapshot_id`); `timeout` seconds later it is
        killed (or paused, with `on_timeout="pause"`) unless extended with `set_timeout`."""
        http = _Http(ConnectionConfig.resolve(api_url, token, request_timeout))
        c = _api.create(template, snapshot_id, timeout, on_timeout, metadata, envs, backend, memory_mib, cpus, pids)
        info = SandboxInfo.parse(http.call(c).json())
        return cls(info.sandbox_id, http, info)

    @classmethod
    def claim(
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
    ) -> "Sandbox":
        """Claims a ready sandbox from a warm pool (see `Pool.claim`): fresh identity, then the
        given env, metadata and files. An empty pool is waited on (`wait` seconds), never
        silently cold-started; `allow_cold=True` starts one and `claim_info.source` says "cold"."""
        http = _Http(ConnectionConfig.resolve(api_url, token, request_timeout))
        c = _pool.claim_call(pool, envs, metadata, files, timeout, on_timeout, wait, allow_cold)
        return _pool.claimed(http, http.call(c).json())

    @classmethod
    def connect(cls, sandbox_id: str, timeout: Optional[float] = None, *, api_url: Optional[str] = None,
                token: Optional[str] = None, request_timeout: Optional[float] = None) -> "Sandbox":
        """Connects to an existing sandbox, resuming it when paused and restarting its timeout."""
        http = _Http(ConnectionConfig.resolve(api_url, token, request_timeout))
        body = {} if timeout is None else {"timeout": timeout}
        info = SandboxInfo.parse(http.call(_api.Call("POST", _api.sandbox_path(sandbox_id, "/connect"), json=body)).json())
        return cls(info.sandbox_id, http, info)

    @classmethod
    def list(cls, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None, *,
             api_url: Optional[str] = None, token: Optional[str] = None) -> List[SandboxInfo]:
        """Sandboxes, optionally only those with all the given metadata pairs or in one state."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return [SandboxInfo.parse(d) for d in http.call(_api.list_sandboxes(metadata, state)).json()]
        finally:
            http.client.close()

    @classmethod
    def list_snapshots(cls, *, api_url: Optional[str] = None, token: Optional[str] = None) -> List[SnapshotInfo]:
        """Every snapshot."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return [SnapshotInfo.parse(d) for d in http.call(_api.Call("GET", "/v1/snapshots")).json()]
        finally:
            http.client.close()

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, cascade: bool = False, *, api_url: Optional[str] = None,
                        token: Optional[str] = None) -> None:
        """Deletes a snapshot (and, with `cascade`, the snapshots descending from it)."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            http.call(_api.delete_snapshot(snapshot_id, cascade))
        finally:
            http.client.close()

    @classmethod
    def gc(cls, dry_run: bool = False, *, api_url: Optional[str] = None, token: Optional[str] = None) -> GcReport:
        """Reconciles sandboxes with their records, then frees what nothing can reach (expired
        snapshots, unreachable fork points, lost sandboxes...); with `dry_run`, only reports."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return GcReport.parse(http.call(_api.gc(dry_run)).json())
        finally:
            http.client.close()

    def get_info(self) -> SandboxInfo:
        """The sandbox's state, metadata and timeout now."""
        self._info = SandboxInfo.parse(self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id))).json())
        return self._info

    def is_running(self) -> bool:
        """True while it is running (not paused, lost or gone)."""
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def kill(self) -> bool:
        """Destroys the sandbox; False when it was already gone."""
        try:
            self._http.call(_api.Call("DELETE", _api.sandbox_path(self.sandbox_id)))
            return True
        except NotFoundError:
            return False

    def pause(self) -> SandboxInfo:
        """Pauses it (its timeout stops); `Sandbox.connect(id)` resumes it."""
        return SandboxInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/pause"))).json())

    def resume(self, timeout: Optional[float] = None) -> SandboxInfo:
        """Resumes a paused sandbox and restarts its timeout."""
        body = {} if timeout is None else {"timeout": timeout}
        return SandboxInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/connect"), json=body)).json())

    def set_timeout(self, timeout: float) -> None:
        """Sets the timeout to `timeout` seconds from now."""
        self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/timeout"), json={"timeout": timeout}))

    def set_history(self, enabled: bool = True) -> None:
        """Step-history mode: every command ends with a checkpoint (``CommandResult.checkpoint``)."""
        self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/history"), json={"enabled": enabled}))

    def fork(self, count: int = 1) -> List[Union["Sandbox", BranchboxError]]:
        """Forks `count` children that continue from this instant; one Sandbox or exception per child."""
        d = self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/fork"), json={"count": count})).json()
        out: List[Union[Sandbox, BranchboxError]] = []
        for c in d["children"]:
            if c["ok"]:
                info = SandboxInfo.parse(c["sandbox"])
                out.append(Sandbox(info.sandbox_id, self._http, info))
            else:
                err = c.get("error") or {}
                out.append(from_response(500, err.get("code"), err.get("message", "the child did not start")))
        return out

    def create_snapshot(self, name: Optional[str] = None) -> SnapshotInfo:
        """Captures the full state; the sandbox keeps running. `Sandbox.create(snapshot_id=...)` starts it again."""
        body = _api.snapshot_body(name)
        return SnapshotInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/snapshots"), json=body)).json())

    def checkpoint(self, name: Optional[str] = None) -> SnapshotInfo:
        """Takes a checkpoint to roll back to later."""
        body = _api.snapshot_body(name)
        return SnapshotInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/checkpoints"), json=body)).json())

    def checkpoints(self) -> List[SnapshotInfo]:
        """This sandbox's checkpoints, oldest first."""
        r = self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id, "/checkpoints")))
        return [SnapshotInfo.parse(d) for d in r.json()]

    def rollback(self, checkpoint_id: str) -> SandboxInfo:
        """Returns this sandbox, in place, to a checkpoint: processes, memory and files."""
        c = _api.rollback(self.sandbox_id, checkpoint_id)
        return SandboxInfo.parse(self._http.call(c).json())

    def lineage(self) -> Lineage:
        """The part of the lineage connected to this sandbox: its ancestors and descendants."""
        return Lineage.parse(self._http.call(_api.Call("GET", "/v1/lineage", params={"sandbox": self.sandbox_id})).json())

    def close(self) -> None:
        """Closes the connection pool (the sandbox keeps running)."""
        self._http.client.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
