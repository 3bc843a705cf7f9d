"""The synchronous client: `Sandbox`, with `commands` and `files`."""

from __future__ import annotations

from typing import IO, Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Union, overload

from . import _api, _claim, _compat, _follow, _udp
from ._compat import SandboxPaginator, class_or_instance
from ._streams import ByteStream
from ._config import ConnectionConfig
from ._pty import Pty
from ._udp import UdpRelay
from .exceptions import (BranchboxError, InvalidArgumentError, NotFoundError, TimeoutException,
                         from_response)
from ._claim import ClaimInfo
from ._http import _Http
from .models import (CommandResult, EntryInfo, GcReport, Lineage, NetworkInfo, ProcessInfo, SandboxInfo, SandboxMetrics,
                     SnapshotInfo, WriteInfo)

#: How much of a file upload is sent per chunk.
UPLOAD_CHUNK = 256 * 1024


class CommandHandle:
    """A background process: from `commands.run(..., background=True)` or `commands.connect(pid)`.

    A handle made with output callbacks (`run(background=True, on_stdout=...)`) or by
    `connect` follows the process's output as it comes (a thread reads it); `wait()` then
    returns when it ends. A plain background handle asks the service for the result in `wait()`."""

    def __init__(self, sandbox: "Sandbox", pid: int, cmd: Union[str, Sequence[str]],
                 follower: Optional[_follow.OutputFollower] = None, reap: bool = True) -> None:
        self._sandbox, self.pid, self._cmd = sandbox, pid, cmd
        self._follower = follower
        # Whether `wait()` takes the service's result (which forgets the process): the handle
        # of the process's starter does, a `connect`ed one reports what it followed.
        self._reap = reap

    def _service_wait(self, timeout: Optional[float]) -> CommandResult:
        c = _api.Call("POST", _api.sandbox_path(self._sandbox.sandbox_id, f"/processes/{self.pid}/wait"),
                      json={"timeout": timeout}, timeout=_api.command_http_timeout(timeout))
        d = self._sandbox._http.call(c).json()
        if d["running"]:
            raise TimeoutException(f"process {self.pid} was still running after {timeout} s")
        return CommandResult.parse(d["result"])

    def wait(self, timeout: Optional[float] = 60.0, on_stdout: Optional[Callable[[str], Any]] = None,
             on_stderr: Optional[Callable[[str], Any]] = None) -> CommandResult:
        """Waits for it to exit; raises `CommandExitException` on failure, `TimeoutException`
        when still running after `timeout` (it runs on). `on_stdout`/`on_stderr` get its output
        (a followed handle's: all of it since it was followed, then the rest as it comes)."""
        if self._follower is None and (on_stdout is not None or on_stderr is not None):
            self._follower = _follow.OutputFollower(self._sandbox._http, self._sandbox.sandbox_id, self.pid,
                                                    None, None, None)
        if self._follower is None:
            return _api.check_exit(self._service_wait(timeout), self._cmd)
        self._follower.set_callbacks(on_stdout, on_stderr)
        followed = self._follower.wait(timeout)
        result = followed
        if self._reap:
            # The service's result has the output from before the stream attached, too.
            try:
                result = self._service_wait(10.0)
            except NotFoundError:
                pass
        return _api.check_exit(result, self._cmd)

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes to its stdin (it was started with `stdin=True` or a text)."""
        self._sandbox.commands.send_stdin(self.pid, data)

    def close_stdin(self) -> None:
        """Closes its stdin: it reads end of file."""
        self._sandbox.commands.close_stdin(self.pid)

    def disconnect(self) -> None:
        """Stops following its output; the process runs on (`commands.connect` follows it again)."""
        if self._follower is not None:
            self._follower.close()

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
            on_stderr: Optional[Callable[[str], Any]] = None, stdin: Union[None, bool, str] = None,
            user: Optional[str] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: Union[str, Sequence[str]], background: bool = ..., envs: Optional[Mapping[str, str]] = None,
            cwd: Optional[str] = None, timeout: Optional[float] = 60.0, on_stdout: Optional[Callable[[str], Any]] = None,
            on_stderr: Optional[Callable[[str], Any]] = None, stdin: Union[None, bool, str] = None,
            user: Optional[str] = None) -> Union[CommandResult, CommandHandle]: ...

    def run(self, cmd, background=None, envs=None, cwd=None, timeout=60.0, on_stdout=None, on_stderr=None, stdin=None,
            user=None):
        """Runs `cmd` (a shell line, or an argv list) as `user` (the sandbox's default user,
        `user` unless chosen at create) in its home unless `cwd` says otherwise, and returns its
        result; raises `CommandExitException` when it fails (`CommandTimeoutException`, also a
        `TimeoutException`, at its timeout; `timeout=0`, as in E2B's, sets none). With
        `on_stdout`/`on_stderr` the output streams to the callbacks as it is produced; with
        `background=True` it returns a `CommandHandle`.
        `stdin`: a text to read; with `background=True`, `True` (E2B's) keeps its stdin open for
        `send_stdin`/`close_stdin`, and a text is written first with it open likewise."""
        sid = self._s.sandbox_id
        user = user or self._s.default_user
        if cwd is not None:
            cwd = _compat.resolve_path(cwd, user)
        text = _follow.stdin_text(stdin)
        if background or timeout == 0:
            body = _api.command_body(cmd, envs, cwd, None, text, user)
            if timeout and stdin is None:
                body["timeout"] = timeout
            pid = self._s._http.call(_api.Call("POST", _api.sandbox_path(sid, "/processes"), json=body)).json()["pid"]
            follower = None
            if on_stdout is not None or on_stderr is not None or not background:
                # From the start: what it printed before the stream was open comes first.
                follower = _follow.OutputFollower(self._s._http, sid, pid, on_stdout, on_stderr, None, replay=True)
            handle = CommandHandle(self._s, pid, cmd, follower)
            if background:
                return handle
            # E2B's timeout=0, no limit: the service bounds a foreground call, so the command
            # runs as a process without a timeout, followed to its end.
            if text is not None:
                self.close_stdin(pid)
            return handle.wait(timeout=None)
        body = _api.command_body(cmd, envs, cwd, timeout, text, user)
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

    def connect(self, pid: int, on_stdout: Optional[Callable[[str], Any]] = None,
                on_stderr: Optional[Callable[[str], Any]] = None, timeout: Optional[float] = 60.0) -> CommandHandle:
        """Follows a running background process's output from now on: `wait()` on the handle
        returns its result (the output since now) or raises as `run` does. `timeout` bounds
        how long it is followed (`0`/None: no bound); `NotFoundError` when there is no such
        process."""
        f = _follow.OutputFollower(self._s._http, self._s.sandbox_id, pid, on_stdout, on_stderr, timeout)
        return CommandHandle(self._s, int(pid), f"process {int(pid)}", f, reap=False)

    def send_stdin(self, pid: int, data: Union[str, bytes]) -> None:
        """Writes to a background process's stdin (text as UTF-8, or bytes). It must have been
        started with `stdin=True` (or a text); `InvalidArgumentError` otherwise or once closed,
        `NotFoundError` when there is no such process."""
        self._s._http.call(_follow.input_call(self._s.sandbox_id, pid, data))

    def close_stdin(self, pid: int) -> None:
        """Closes a background process's stdin: it reads end of file."""
        self._s._http.call(_follow.input_call(self._s.sandbox_id, pid, None, eof=True))

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
    """Files in one sandbox. Relative paths are under the user's home (`/home/user`), as in
    E2B. Every call acts as that user (or the `user` it is given): it may do what the user's
    commands may, and files and directories it makes are the user's."""

    def __init__(self, sandbox: "Sandbox") -> None:
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

    @overload
    def read(self, path: str, format: Literal["text"] = "text", user: Optional[str] = None) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], user: Optional[str] = None) -> bytes: ...

    @overload
    def read(self, path: str, format: Literal["stream"], user: Optional[str] = None) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text", user: Optional[str] = None) -> Union[str, bytes, Iterator[bytes]]:
        """Reads a file as text (UTF-8), as bytes (`format="bytes"`), or as an iterator of byte
        chunks (`format="stream"`, for files too large to hold; the stream closes when the
        iterator is exhausted or closed)."""
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentError(f"format {format!r} is not one of 'text', 'bytes', 'stream'")
        c = _api.Call("GET", self._path(), params=self._query(path, user))
        if format == "stream":
            return self._chunks(c)
        with self._s._http.stream(c) as r:
            data = b"".join(r.iter_bytes())
        return data if format == "bytes" else data.decode("utf-8", "replace")

    def _chunks(self, c: _api.Call) -> Iterator[bytes]:
        # The request is sent here, before the first chunk is asked for, so that a missing
        # file raises at `read` as it does for the other formats.
        return ByteStream(self._s._http.stream(c))

    @overload
    def write(self, path: str, data: Union[str, bytes, IO[bytes]], mode: Optional[int] = None,
              user: Optional[str] = None) -> WriteInfo: ...

    @overload
    def write(self, path: Sequence[Mapping[str, Any]], data: None = None, mode: Optional[int] = None,
              user: Optional[str] = None) -> List[WriteInfo]: ...

    def write(self, path, data=None, mode=None, user=None):
        """Writes a file (replacing it atomically), creating missing parent directories, owned
        by `user`; returns its `WriteInfo` (`path`, `name`, `type`, `size`). Given a list of
        `{"path": ..., "data": ...}` instead, writes each and returns the list of infos."""
        many, entries = _compat.write_entries(path, data)
        out = [self._write_one(p, d, mode, user) for p, d in entries]
        return out if many else out[0]

    def write_files(self, files: Sequence[Mapping[str, Any]], user: Optional[str] = None) -> List[WriteInfo]:
        """Writes several files (`{"path": ..., "data": ...}` each); E2B's name for a list write."""
        return self.write(list(files), user=user)

    def _write_one(self, path: str, data: Union[str, bytes, IO[bytes]], mode: Optional[int],
                   user: Optional[str]) -> WriteInfo:
        owner = user or self._s.default_user
        params: Dict[str, Any] = {"path": self._abs(path, owner)}
        if owner:
            params["user"] = owner
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
        return WriteInfo.parse(r.json())

    def list(self, path: str, user: Optional[str] = None) -> List[EntryInfo]:
        """Entries of a directory."""
        r = self._s._http.call(_api.Call("GET", self._path("/list"), params=self._query(path, user)))
        return [EntryInfo.parse(e) for e in r.json()]

    def get_info(self, path: str, user: Optional[str] = None) -> EntryInfo:
        """Metadata of a path."""
        c = _api.Call("GET", self._path("/stat"), params=self._query(path, user))
        return EntryInfo.parse(self._s._http.call(c).json())

    def exists(self, path: str, user: Optional[str] = None) -> bool:
        """True when the path exists."""
        try:
            self.get_info(path, user)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, recursive: bool = True, user: Optional[str] = None) -> None:
        """Removes a file or a directory (with its contents unless `recursive=False`)."""
        params = {**self._query(path, user), "recursive": str(recursive).lower()}
        self._s._http.call(_api.Call("DELETE", self._path(), params=params))

    def rename(self, old_path: str, new_path: str, user: Optional[str] = None) -> EntryInfo:
        """Renames a path; returns the renamed entry."""
        old, new = self._query(old_path, user), self._query(new_path, user)
        body = {"from": old["path"], "to": new["path"]}
        if "user" in old:
            body["user"] = old["user"]
        self._s._http.call(_api.Call("POST", self._path("/rename"), json=body))
        return self.get_info(new["path"], user)

    def watch_dir(self, path: str, recursive: bool = False, user: Optional[str] = None) -> _follow.WatchHandle:
        """Watches a directory (and with `recursive=True` its subdirectories): the handle's
        `get_new_events()` answers the `FilesystemEvent`s since the last call; `stop()` ends
        it. `NotFoundError` for a missing path, `InvalidArgumentError` for a non-directory."""
        return _follow.WatchHandle(self._s._http, self._s.sandbox_id, self._abs(path, user), recursive)

    def make_dir(self, path: str, user: Optional[str] = None) -> bool:
        """Creates a directory and its parents, owned by `user`; False when it existed already."""
        owner = user or self._s.default_user
        body: Dict[str, Any] = {"path": self._abs(path, owner), "parents": True}
        if owner:
            body["user"] = owner
        r = self._s._http.call(_api.Call("POST", self._path("/mkdir"), json=body))
        return bool(r.json()["created"])


class Sandbox:
    """A sandbox behind a branchbox service. `Sandbox(...)` creates one, as in E2B's SDK, with
    the arguments of `Sandbox.create(...)`; `Sandbox.connect(id)` attaches to one that exists."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `Sandbox(sandbox_id, http, info)` is the SDK's own handle on a sandbox that exists
        # (connect, fork, claim); any other call creates one.
        if len(args) >= 2 and isinstance(args[1], _Http):
            self._bind(*args, **kwargs)
            return
        made = type(self).create(*args, **kwargs)
        self._bind(made.sandbox_id, made._http, made._info, user=made.default_user, template=made._template)

    def _bind(self, sandbox_id: str, http: _Http, info: Optional[SandboxInfo] = None, *,
              user: Optional[str] = None, template: Optional[str] = None, image: Optional[str] = None) -> None:
        self.sandbox_id = sandbox_id
        self._http = http
        self._template = template
        self._info = _compat.with_template(info, template) if info is not None else None
        #: The account commands run as and files belong to unless a call names another.
        self.default_user = _compat.default_user(user, template, image)
        self.commands = Commands(self)
        self.files = Files(self)
        #: Terminals (E2B's `sandbox.pty`).
        self.pty = Pty(self)
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
    ) -> "Sandbox":
        """Starts a sandbox from the template (or from `snapshot_id`, or from the image named by
        `image`: "default", "minimal" or an imported one); `timeout` seconds later it is killed
        (or paused, with `on_timeout="pause"`) unless extended with `set_timeout`.
        `template="base"` (E2B's name) is the default image; `api_key` is E2B's name for
        `token`; `user` is the account commands and files use by default (`user`).
        Without `allow_internet_access` or `network` it has no network; True gives it the public
        internet (private ranges refused), False a network that reaches nothing but still serves
        its ports, and `network` a policy (`{"mode": "allow_list", "allow": ["192.0.2.0/24"]}`);
        gvisor only (docs/network.md). Its ports answer at `get_host`'s address to root and the
        service's user only; `open_ports=True` opens them to every local user on purpose."""
        http = _Http(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token), request_timeout))
        c = _api.create(_compat.template_name(template), snapshot_id, timeout, on_timeout, metadata, envs, backend,
                        memory_mib, cpus, pids, image=image, network=network,
                        allow_internet_access=allow_internet_access, open_ports=open_ports)
        info = SandboxInfo.parse(http.call(c).json())
        s = cls.__new__(cls)
        s._bind(info.sandbox_id, http, info, user=user, template=template, image=image)
        return s

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
        c = _claim.claim_call(pool, envs, metadata, files, timeout, on_timeout, wait, allow_cold)
        return _claim.claimed(cls, http, http.call(c).json())

    @classmethod
    def connect(cls, sandbox_id: str, timeout: Optional[float] = None, *, api_url: Optional[str] = None,
                token: Optional[str] = None, request_timeout: Optional[float] = None, api_key: Optional[str] = None,
                user: Optional[str] = None) -> "Sandbox":
        """Connects to an existing sandbox, resuming it when paused and restarting its timeout."""
        http = _Http(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token), request_timeout))
        body = {} if timeout is None else {"timeout": timeout}
        info = SandboxInfo.parse(http.call(_api.Call("POST", _api.sandbox_path(sandbox_id, "/connect"), json=body)).json())
        s = cls.__new__(cls)
        s._bind(info.sandbox_id, http, info, user=user)
        return s

    @classmethod
    def list(cls, metadata: Optional[Mapping[str, str]] = None, state: Optional[str] = None, *, query: Any = None,
             local: bool = False, api_url: Optional[str] = None, token: Optional[str] = None,
             api_key: Optional[str] = None, **_paging: Any) -> SandboxPaginator:
        """Sandboxes, optionally only those with all the given metadata pairs or in one state
        (or E2B's `query=` with `metadata` and `state`). A list, and E2B's paginator too
        (`has_next`, `next_items()`); the service answers in one page, so E2B's `limit` and
        `next_token` are accepted and change nothing. Through a node with fleet peers it lists
        every node's sandboxes, each with its `node` (`local=True`: that node's own only); peers
        that did not answer are in the answer's `unanswered_peers` and a `PartialListWarning`."""
        metadata, state, states = _compat.list_filters(query, metadata, state)
        http = _Http(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token)))
        try:
            return _compat.listing(SandboxPaginator, http.call(_api.list_sandboxes(metadata, state, local)), states)
        finally:
            http.client.close()

    @classmethod
    def _by_id(cls, sandbox_id: str, api_url: Optional[str], token: Optional[str], api_key: Optional[str]) -> "Sandbox":
        """A handle on `sandbox_id` without connecting (no resume, no timeout change)."""
        s = cls.__new__(cls)
        s._bind(sandbox_id, _Http(ConnectionConfig.resolve(api_url, _compat.token_of(api_key, token))))
        return s

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
    def push_snapshot(cls, snapshot: str, *, api_url: Optional[str] = None,
                      token: Optional[str] = None) -> Dict[str, Any]:
        """Pushes a snapshot (id or name) to the service's S3 store: the chunks the store lacks,
        then its manifest (docs/remote.md). Answers the push report (`snapshot`, `chunks`,
        `sent_chunks`, `sent_bytes`, `skipped_bytes`, `seconds`)."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return http.call(_api.push_snapshot(snapshot)).json()
        finally:
            http.client.close()

    @classmethod
    def pull_snapshot(cls, snapshot_id: str, peer: Optional[str] = None, *, api_url: Optional[str] = None,
                      token: Optional[str] = None) -> Dict[str, Any]:
        """Pulls a pushed snapshot into the service under the same id; `Sandbox.create(snapshot_id=...)`
        then starts it. With `peer` (a node of the service's peers file that holds it), each
        chunk comes from that node first and from S3 when it fails. Answers the pull report
        (`fetched_bytes` = `peer_bytes` + `s3_bytes`, `reused_bytes`, `peer_error`, ...)."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return http.call(_api.pull_snapshot(snapshot_id, peer)).json()
        finally:
            http.client.close()

    @classmethod
    def fleet_capacity(cls, *, api_url: Optional[str] = None, token: Optional[str] = None) -> Dict[str, int]:
        """The service's sandboxes against its `--max-sandboxes`: `sandboxes` (running or paused),
        `max_sandboxes`, and `room` (how many more it would start now)."""
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            return http.call(_api.fleet_capacity()).json()
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

    @class_or_instance
    def get_info(self) -> SandboxInfo:
        """The sandbox's state, metadata and timeout now; also `Sandbox.get_info(sandbox_id)`."""
        info = SandboxInfo.parse(self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id))).json())
        self._info = _compat.with_template(info, self._template)
        return self._info

    @get_info.on_class
    def _get_info_by_id(cls, sandbox_id: str, *, api_url: Optional[str] = None, token: Optional[str] = None,
                        api_key: Optional[str] = None) -> SandboxInfo:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            return s.get_info()
        finally:
            s.close()

    def get_host(self, port: int) -> str:
        """`HOST:PORT` where the host branchboxd runs on reaches a server listening on `port` in
        this networked sandbox (E2B's `get_host`; prefix `http://`). The same server answers
        through the service at `proxy_url(port)`, behind its token."""
        return self._http.call(_api.Call("GET", _api.host_path(self.sandbox_id, port))).json()["address"]

    def proxy_url(self, port: int) -> str:
        """The URL of `port` through branchboxd's proxy; send the service's token with it."""
        _api.host_path(self.sandbox_id, port)
        return f"{self._http.cfg.api_url}{_api.sandbox_path(self.sandbox_id, f'/ports/{port}/')}"

    def udp(self, port: int, request_timeout: Optional[float] = None) -> UdpRelay:
        """A relay of datagrams to and from UDP `port` of this networked sandbox, through
        branchboxd behind its token (a WebSocket): `send(data)` one datagram, `recv(timeout)`
        the next one back, `close()`; a context manager. The service ends it after 120 s
        without a datagram either way. Raises the service's typed error when it is refused
        (`InvalidArgumentError` for a sandbox without a network or a bad port)."""
        return _udp.open_relay(self, port, request_timeout)

    def get_network(self) -> NetworkInfo:
        """The egress policy and counters of this networked sandbox."""
        return NetworkInfo.parse(self._http.call(_api.Call("GET", _api.sandbox_path(self.sandbox_id, "/network"))).json())

    def set_network(self, mode: str, allow: Optional[Sequence[str]] = None) -> NetworkInfo:
        """Replaces the egress policy at once: "internet", "deny_all", or "allow_list" with
        `allow`; snapshots and forks taken from now on carry it."""
        body = _api.network_policy(mode, allow)
        c = _api.Call("PUT", _api.sandbox_path(self.sandbox_id, "/network"), json=body)
        return NetworkInfo.parse(self._http.call(c).json())

    def get_metrics(self) -> List[SandboxMetrics]:
        """Resource use now, measured in the sandbox (memory, CPUs and their use over 0.1 s,
        disk), as a one-item list like E2B's. Runs a short command as a background process,
        so step-history mode takes no checkpoint for it."""
        h = self.commands.run(["/bin/sh", "-c", _compat.METRICS_SCRIPT], background=True, user="root", timeout=30)
        return [_compat.parse_metrics(h.wait(timeout=30).stdout)]

    def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """True while it is running (not paused, lost or gone); `request_timeout` (E2B's)
        bounds the request."""
        c = _api.Call("GET", _api.sandbox_path(self.sandbox_id), timeout=request_timeout)
        try:
            return SandboxInfo.parse(self._http.call(c).json()).state == "running"
        except NotFoundError:
            return False

    @class_or_instance
    def kill(self) -> bool:
        """Destroys the sandbox; False when it was already gone. Also `Sandbox.kill(sandbox_id)`."""
        try:
            self._http.call(_api.Call("DELETE", _api.sandbox_path(self.sandbox_id)))
            return True
        except NotFoundError:
            return False

    @kill.on_class
    def _kill_by_id(cls, sandbox_id: str, *, api_url: Optional[str] = None, token: Optional[str] = None,
                    api_key: Optional[str] = None) -> bool:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            return s.kill()
        finally:
            s.close()

    def pause(self) -> SandboxInfo:
        """Pauses it (its timeout stops); `Sandbox.connect(id)` resumes it."""
        return SandboxInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/pause"))).json())

    def resume(self, timeout: Optional[float] = None) -> SandboxInfo:
        """Resumes a paused sandbox and restarts its timeout."""
        body = {} if timeout is None else {"timeout": timeout}
        return SandboxInfo.parse(self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/connect"), json=body)).json())

    @class_or_instance
    def set_timeout(self, timeout: float) -> None:
        """Sets the timeout to `timeout` seconds from now; also `Sandbox.set_timeout(sandbox_id, timeout)`."""
        self._http.call(_api.Call("POST", _api.sandbox_path(self.sandbox_id, "/timeout"), json={"timeout": timeout}))

    @set_timeout.on_class
    def _set_timeout_by_id(cls, sandbox_id: str, timeout: float, *, api_url: Optional[str] = None,
                           token: Optional[str] = None, api_key: Optional[str] = None) -> None:
        s = cls._by_id(sandbox_id, api_url, token, api_key)
        try:
            s.set_timeout(timeout)
        finally:
            s.close()

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
                child = Sandbox.__new__(type(self))
                child._bind(info.sandbox_id, self._http, info, user=self.default_user, template=self._template)
                out.append(child)
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
