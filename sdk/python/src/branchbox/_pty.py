"""Terminals: `GET /v1/sandboxes/{id}/pty`, a WebSocket, behind `sandbox.pty` (E2B's name).

Binary messages carry keys typed (to the service) and terminal output (from it); text messages
carry JSON: `{"type": "resize", "cols", "rows"}` to the service, `{"type": "exit", "code",
"signal"}` or `{"type": "error", "code", "message"}` from it, each followed by a normal close.
Closing the socket ends the command: the sandbox's agent kills its process group (SIGKILL).

The sync handle reads on a thread of its own when given `on_data`, else in `wait()` or while
iterated; the async handle reads in a task.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union
from urllib.parse import urlencode

from . import _api, _compat
from .exceptions import (BranchboxError, CommandTimeoutException, InvalidArgumentError, NotFoundError,
                         ServiceUnavailableError, TimeoutException, from_code)
from .models import CommandResult

if TYPE_CHECKING:
    from .async_sandbox import AsyncSandbox
    from .sandbox import Sandbox

#: Largest binary message sent at once (the service refuses messages over 64 KiB).
INPUT_CHUNK = 32 * 1024
#: Output messages a sync handle's connection holds before it stops reading the socket (the
#: terminal then waits for its reader, as a real one does).
MAX_QUEUE = 1024
#: How long closing waits for the service's answer before the connection is dropped.
CLOSE_TIMEOUT = 5.0
#: The signal `kill()` reports: the agent ends a terminal whose client left with SIGKILL.
SIGKILL = 9

_pids = itertools.count(1)


@dataclass(frozen=True)
class PtySize:
    """A terminal's size, as E2B's `PtySize(rows, cols)`: 1 to 1000 each."""

    rows: int = 24
    cols: int = 80


def _dim(what: str, n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidArgumentError(f"{what} {n!r}: give a whole number from 1 to 1000")
    return n


def _size_of(size: Optional[PtySize]) -> Tuple[int, int]:
    """(cols, rows) of a size; their range is the service's to check at create."""
    if size is None:
        size = PtySize()
    return _dim("cols", getattr(size, "cols", None)), _dim("rows", getattr(size, "rows", None))


def resize_message(size: PtySize) -> str:
    """The control message of a resize, checked here: the service's refusal of a size would
    come back on the socket, long after the call returned."""
    cols, rows = _size_of(size)
    if not (1 <= cols <= 1000 and 1 <= rows <= 1000):
        raise InvalidArgumentError(f"size {cols}x{rows}: cols and rows must be 1 to 1000", code="invalid_size")
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def chunks(data: Union[bytes, bytearray, memoryview, str]) -> Iterator[bytes]:
    """Input as binary messages the service accepts."""
    if isinstance(data, str):
        b = data.encode()
    elif isinstance(data, (bytes, bytearray, memoryview)):
        b = bytes(data)
    else:
        raise InvalidArgumentError(f"stdin data must be bytes or str, not {type(data).__name__}")
    for i in range(0, len(b), INPUT_CHUNK):
        yield b[i:i + INPUT_CHUNK]


def open_request(sandbox: Any, size: Optional[PtySize], user: Optional[str], cwd: Optional[str],
                 envs: Optional[Mapping[str, str]], cmd: Optional[str]) -> Tuple[str, Dict[str, str], str]:
    """The WebSocket URL, the headers (the client's token, verified as for every call) and the
    user agent of a terminal of `sandbox` (a `Sandbox` or an `AsyncSandbox`)."""
    if envs:
        raise InvalidArgumentError(
            "envs: a terminal takes no environment of its own (the service's pty route has no env); "
            "set them in the shell (`export K=V`) or at Sandbox.create(envs=...)", code="unsupported")
    cols, rows = _size_of(size)
    query: Dict[str, Any] = {"cols": cols, "rows": rows}
    if cmd is not None:
        query["cmd"] = cmd
    user = user or sandbox.default_user
    if user is not None:
        query["user"] = user
    if cwd is not None:
        query["cwd"] = _compat.resolve_path(cwd, user)
    return websocket_request(sandbox, f"{_api.sandbox_path(sandbox.sandbox_id, '/pty')}?{urlencode(query)}")


def websocket_request(sandbox: Any, path: str) -> Tuple[str, Dict[str, str], str]:
    """The WebSocket URL of `path` on `sandbox`'s service, the headers (the client's token) and
    the user agent."""
    cfg = sandbox._http.cfg
    base = cfg.api_url
    if base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    headers = cfg.headers()
    agent = headers.pop("user-agent")
    return f"{base}{path}", headers, agent


def connect_error(e: BaseException, api_url: str, what: str = "terminal") -> BranchboxError:
    """The typed exception for a handshake (of a `what`) that failed: the service's refusal
    (its status and error body, as for any call), a timeout, or a service that cannot be
    reached."""
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    if isinstance(e, InvalidStatus):
        r = e.response
        return _api.error_of(r.status_code, r.body, r.reason_phrase)
    if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
        return TimeoutException(f"the {what} at {api_url} did not open in time")
    if isinstance(e, (OSError, InvalidHandshake)):
        return ServiceUnavailableError(f"cannot open a {what} at {api_url}: {e}")
    return BranchboxError(f"cannot open a {what} at {api_url}: {e}")


class _Outcome:
    """How a terminal ended, from its messages; shared by the sync and async handles."""

    def __init__(self, pid: int, timeout: Optional[float]) -> None:
        #: The SDK's number for this terminal (not a process id in the sandbox: the service
        #: does not tell it); what `sandbox.pty.send_stdin(pid, ...)` and the others take.
        self.pid = pid
        self._timeout = timeout
        self._result: Optional[CommandResult] = None
        self._error: Optional[BaseException] = None
        self._timed_out = False
        self._ended = False

    def _message(self, msg: Union[str, bytes]) -> Optional[bytes]:
        """The output a message carries, or None after noting a control message."""
        if isinstance(msg, (bytes, bytearray, memoryview)):
            return bytes(msg)
        try:
            m = json.loads(msg)
        except ValueError:
            return None
        if not isinstance(m, dict):
            return None
        if m.get("type") == "exit" and self._result is None:
            code, sig = m.get("code"), m.get("signal")
            self._result = CommandResult(stdout="", stderr="", exit_code=code if isinstance(code, int) else None,
                                         signal=sig if isinstance(sig, int) else None)
        elif m.get("type") == "error" and self._error is None:
            code = m.get("code") if isinstance(m.get("code"), str) else None
            self._error = from_code(code, str(m.get("message") or "the terminal failed"))
        return None

    def _killed(self) -> None:
        if self._result is None:
            self._result = CommandResult(stdout="", stderr="", exit_code=None, signal=SIGKILL)

    def _outcome(self) -> CommandResult:
        """The result once the connection closed, or the reason there is none."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        if self._timed_out:
            raise CommandTimeoutException(
                f"the terminal ran past its timeout of {self._timeout} s; its connection was closed, "
                "which ended its process group", stdout="", stderr="", exit_code=None, signal=SIGKILL,
                timed_out=True)
        raise BranchboxError("the terminal's connection closed before its exit status", code="stream_cut")

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once it ended (None while running, or when killed by a signal)."""
        return self._result.exit_code if self._result is not None else None


def _closed_error() -> BranchboxError:
    return BranchboxError("the terminal has ended", code="pty_closed")


class PtyHandle(_Outcome):
    """A terminal opened with `sandbox.pty.create(...)` (E2B's `CommandHandle` for a pty)."""

    def __init__(self, ws: Any, pid: int, on_data: Optional[Callable[[bytes], Any]], timeout: Optional[float],
                 registry: Dict[int, Any]) -> None:
        super().__init__(pid, timeout)
        self._ws = ws
        self._registry = registry
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._callback_error: Optional[BaseException] = None
        self._timer: Optional[threading.Timer] = None
        if timeout:
            self._timer = threading.Timer(timeout, self._expire)
            self._timer.daemon = True
            self._timer.start()
        self._on_data = on_data
        self._thread: Optional[threading.Thread] = None
        if on_data is not None:
            self._thread = threading.Thread(target=self._pump, name=f"branchbox-pty-{pid}", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:
        return f"PtyHandle(pid={self.pid})"

    def _expire(self) -> None:
        if not self._ended:
            self._timed_out = True
            self._ws.close()

    def _recv(self, timeout: Optional[float]) -> Optional[bytes]:
        """One message's output (b"" for a control message); None once the connection closed."""
        from websockets.exceptions import ConnectionClosed

        try:
            msg = self._ws.recv(timeout=timeout)
        except ConnectionClosed:
            self._end()
            return None
        return self._message(msg) or b""

    def _end(self) -> None:
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
        self._registry.pop(self.pid, None)
        self._done.set()

    def _pump(self) -> None:
        while True:
            data = self._recv(None)
            if data is None:
                return
            if data and self._on_data is not None:
                try:
                    self._on_data(data)
                except Exception as e:  # the first is raised by wait(); output goes on
                    if self._callback_error is None:
                        self._callback_error = e

    def __iter__(self) -> Iterator[Tuple[None, None, bytes]]:
        """Output as it comes, as E2B's `(stdout, stderr, pty)` tuples (only `pty` is set),
        until the terminal ends; then `wait()` gives how. Not with `on_data`."""
        if self._thread is not None:
            raise InvalidArgumentError("this terminal's output goes to the on_data given at create")
        with self._lock:
            while True:
                data = self._recv(None)
                if data is None:
                    return
                if data:
                    yield None, None, data

    def wait(self, on_pty: Optional[Callable[[bytes], Any]] = None, timeout: Optional[float] = None) -> CommandResult:
        """Waits for the terminal to end and returns how: `exit_code` (and `signal`, 9 after
        `kill()`); a non-zero exit is not an error (it is the last command's, typed by
        whoever used the terminal). `on_pty` receives the output read meanwhile (without
        `on_data`). Raises `TimeoutException` when it is still running after `timeout` seconds
        (it keeps running), `CommandTimeoutException` when it ran past create's `timeout`, and
        the service's typed error when the terminal failed."""
        if self._thread is not None:
            if on_pty is not None:
                raise InvalidArgumentError("this terminal's output goes to the on_data given at create")
            if not self._done.wait(timeout):
                raise TimeoutException(f"terminal {self.pid} was still running after {timeout} s")
            if self._callback_error is not None:
                raise self._callback_error
            return self._outcome()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not self._ended:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    data = self._recv(left)
                except TimeoutError:
                    raise TimeoutException(f"terminal {self.pid} was still running after {timeout} s") from None
                if data and on_pty is not None:
                    on_pty(data)
        return self._outcome()

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Types `data` (bytes, or text as UTF-8) into the terminal."""
        from websockets.exceptions import ConnectionClosed

        try:
            for c in chunks(data):
                self._ws.send(c)
        except ConnectionClosed:
            raise _closed_error() from None

    def resize(self, size: PtySize) -> None:
        """Changes the terminal's size (the command sees SIGWINCH)."""
        from websockets.exceptions import ConnectionClosed

        msg = resize_message(size)
        try:
            self._ws.send(msg)
        except ConnectionClosed:
            raise _closed_error() from None

    def kill(self) -> bool:
        """Ends the terminal: closes its connection, and the service's agent kills its process
        group (SIGKILL; there is no kill message). False when it had already ended."""
        if self._ended:
            return False
        self._killed()
        self._ws.close()
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT * 2)
        else:
            with self._lock:
                while self._recv(None) is not None:
                    pass
        return True

    def disconnect(self) -> None:
        """E2B's disconnect leaves the command running; here the connection is the terminal,
        so this is `kill()`."""
        self.kill()


class Pty:
    """Terminals in one sandbox (`sandbox.pty`), as E2B's: `create` returns a handle, and
    `send_stdin`, `resize` and `kill` take its `pid` (or the handle)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._s = sandbox
        self._open: Dict[int, PtyHandle] = {}

    def create(self, size: Optional[PtySize] = None, user: Optional[str] = None, cwd: Optional[str] = None,
               envs: Optional[Mapping[str, str]] = None, timeout: Optional[float] = 60,
               request_timeout: Optional[float] = None, *, on_data: Optional[Callable[[bytes], Any]] = None,
               cmd: Optional[str] = None) -> PtyHandle:
        """Opens a terminal (80x24 unless `size`) running a login shell, or the shell line
        `cmd`, as `user` (the sandbox's default user unless named) in `cwd` (its home unless
        named). With `on_data` the output goes to it from a thread of the handle; else `wait()`
        or iterating the handle reads it. `timeout` seconds after it opened (E2B's default 60;
        0 or None: no limit) the connection is closed, which ends it. `envs` is refused: the
        route has none. Raises the service's typed error when it is refused (`NotFoundError`,
        `ConflictError` for a paused sandbox, `InvalidArgumentError` for a bad size)."""
        url, headers, agent = open_request(self._s, size, user, cwd, envs, cmd)
        try:
            from websockets.sync.client import connect
        except ImportError as e:  # pragma: no cover
            raise BranchboxError("sandbox.pty needs the `websockets` package: pip install websockets") from e
        api_url = self._s._http.cfg.api_url
        try:
            # Entered as a context manager, the form every version of the package takes without
            # a warning (17.1 deprecates a bare connect()); the handle closes it.
            ws = connect(url, additional_headers=headers, user_agent_header=agent, compression=None,
                         open_timeout=request_timeout if request_timeout is not None else self._s._http.cfg.request_timeout,
                         close_timeout=CLOSE_TIMEOUT, ping_interval=None, max_queue=MAX_QUEUE).__enter__()
        except Exception as e:
            raise connect_error(e, api_url) from e
        pid = next(_pids)
        h = PtyHandle(ws, pid, on_data, timeout, self._open)
        self._open[pid] = h
        return h

    def _handle(self, pid: Union[int, PtyHandle]) -> PtyHandle:
        if isinstance(pid, PtyHandle):
            return pid
        h = self._open.get(pid)
        if h is None:
            raise NotFoundError(f"no open terminal {pid!r} in sandbox {self._s.sandbox_id}", code="not_found")
        return h

    def send_stdin(self, pid: Union[int, PtyHandle], data: Union[bytes, str], request_timeout: Optional[float] = None) -> None:
        """Types `data` into terminal `pid`."""
        self._handle(pid).send_stdin(data)

    def resize(self, pid: Union[int, PtyHandle], size: PtySize, request_timeout: Optional[float] = None) -> None:
        """Resizes terminal `pid`."""
        self._handle(pid).resize(size)

    def kill(self, pid: Union[int, PtyHandle], request_timeout: Optional[float] = None) -> bool:
        """Ends terminal `pid`; False when it had ended or is not known."""
        try:
            h = self._handle(pid)
        except NotFoundError:
            return False
        return h.kill()


class AsyncPtyHandle(_Outcome):
    """A terminal opened with `await sandbox.pty.create(...)`; its output goes to `on_data`
    (a function or a coroutine function) from a task of the handle."""

    def __init__(self, ws: Any, pid: int, on_data: Optional[Callable[[bytes], Any]], timeout: Optional[float],
                 registry: Dict[int, Any]) -> None:
        super().__init__(pid, timeout)
        self._ws = ws
        self._registry = registry
        self._on_data = on_data
        self._callback_error: Optional[BaseException] = None
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(timeout, self._expire) if timeout else None
        self._closing: Optional["asyncio.Task[None]"] = None
        self._task = loop.create_task(self._pump())

    def __repr__(self) -> str:
        return f"AsyncPtyHandle(pid={self.pid})"

    def _expire(self) -> None:
        if not self._ended:
            self._timed_out = True
            self._closing = asyncio.ensure_future(self._ws.close())

    async def _pump(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    msg = await self._ws.recv()
                except ConnectionClosed:
                    return
                data = self._message(msg)
                if data and self._on_data is not None:
                    try:
                        r = self._on_data(data)
                        if inspect.isawaitable(r):
                            await r
                    except Exception as e:  # the first is raised by wait(); output goes on
                        if self._callback_error is None:
                            self._callback_error = e
        finally:
            self._ended = True
            if self._timer is not None:
                self._timer.cancel()
            self._registry.pop(self.pid, None)

    async def wait(self) -> CommandResult:
        """Waits for the terminal to end and returns how (see `PtyHandle.wait`); bound it with
        `asyncio.wait_for`, which leaves the terminal running."""
        await asyncio.shield(self._task)
        if self._callback_error is not None:
            raise self._callback_error
        return self._outcome()

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        """Types `data` (bytes, or text as UTF-8) into the terminal."""
        from websockets.exceptions import ConnectionClosed

        try:
            for c in chunks(data):
                await self._ws.send(c)
        except ConnectionClosed:
            raise _closed_error() from None

    async def resize(self, size: PtySize) -> None:
        """Changes the terminal's size."""
        from websockets.exceptions import ConnectionClosed

        msg = resize_message(size)
        try:
            await self._ws.send(msg)
        except ConnectionClosed:
            raise _closed_error() from None

    async def kill(self) -> bool:
        """Ends the terminal (see `PtyHandle.kill`); False when it had already ended."""
        if self._ended:
            return False
        self._killed()
        await self._ws.close()
        await asyncio.shield(self._task)
        return True

    async def disconnect(self) -> None:
        """As `PtyHandle.disconnect`: the same as `kill()`."""
        await self.kill()


class AsyncPty:
    """Terminals in one sandbox (`sandbox.pty` of an `AsyncSandbox`)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._s = sandbox
        self._open: Dict[int, AsyncPtyHandle] = {}

    async def create(self, size: Optional[PtySize] = None, on_data: Optional[Callable[[bytes], Any]] = None,
                     user: Optional[str] = None, cwd: Optional[str] = None, envs: Optional[Mapping[str, str]] = None,
                     timeout: Optional[float] = 60, request_timeout: Optional[float] = None, *,
                     cmd: Optional[str] = None) -> AsyncPtyHandle:
        """Opens a terminal, as `Pty.create`; output goes to `on_data` (E2B's order of
        arguments: `size, on_data, user, cwd, envs, timeout`); without it, it is dropped."""
        url, headers, agent = open_request(self._s, size, user, cwd, envs, cmd)
        try:
            from websockets.asyncio.client import connect
        except ImportError as e:  # pragma: no cover
            raise BranchboxError("sandbox.pty needs the `websockets` package: pip install websockets") from e
        api_url = self._s._http.cfg.api_url
        try:
            ws = await connect(url, additional_headers=headers, user_agent_header=agent, compression=None,
                               open_timeout=request_timeout if request_timeout is not None else self._s._http.cfg.request_timeout,
                               close_timeout=CLOSE_TIMEOUT, ping_interval=None)
        except Exception as e:
            raise connect_error(e, api_url) from e
        pid = next(_pids)
        h = AsyncPtyHandle(ws, pid, on_data, timeout, self._open)
        self._open[pid] = h
        return h

    def _handle(self, pid: Union[int, AsyncPtyHandle]) -> AsyncPtyHandle:
        if isinstance(pid, AsyncPtyHandle):
            return pid
        h = self._open.get(pid)
        if h is None:
            raise NotFoundError(f"no open terminal {pid!r} in sandbox {self._s.sandbox_id}", code="not_found")
        return h

    async def send_stdin(self, pid: Union[int, AsyncPtyHandle], data: Union[bytes, str],
                         request_timeout: Optional[float] = None) -> None:
        """Types `data` into terminal `pid`."""
        await self._handle(pid).send_stdin(data)

    async def resize(self, pid: Union[int, AsyncPtyHandle], size: PtySize, request_timeout: Optional[float] = None) -> None:
        """Resizes terminal `pid`."""
        await self._handle(pid).resize(size)

    async def kill(self, pid: Union[int, AsyncPtyHandle], request_timeout: Optional[float] = None) -> bool:
        """Ends terminal `pid`; False when it had ended or is not known."""
        try:
            h = self._handle(pid)
        except NotFoundError:
            return False
        return await h.kill()
