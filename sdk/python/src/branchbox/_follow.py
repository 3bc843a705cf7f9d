"""Following what goes on in a sandbox: a background process's output as it comes (`GET
.../processes/{pid}/output`) and a directory's changes (`GET .../files/watch`), both server-sent
events, read by a thread (sync) or a task (async); and writing to a process's open stdin."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import httpx

from . import _api
from .exceptions import BranchboxError, InvalidArgumentError, ServiceUnavailableError, TimeoutException, from_code
from .models import CommandResult, FilesystemEvent

#: Seconds a follow stream may stay silent before the client gives up on it: the service sends
#: a keep-alive comment every 15 s however quiet the process or directory is.
READ_TIMEOUT = 90.0

Callback = Callable[[str], Any]


def stdin_text(stdin: Union[None, bool, str]) -> Optional[str]:
    """The service's `stdin` for E2B's `stdin=True` (open, nothing written yet: ""), a text to
    write first, or None (False, None: no stdin)."""
    if stdin is None or stdin is False:
        return None
    if stdin is True:
        return ""
    if isinstance(stdin, str):
        return stdin
    raise InvalidArgumentError(f"stdin {type(stdin).__name__}: give True, False or the text to write first")


def input_call(sandbox_id: str, pid: int, data: Union[None, str, bytes], eof: bool = False) -> _api.Call:
    """Writes `data` (text as UTF-8, or bytes) to a background process's stdin; `eof` closes it."""
    body: Dict[str, Any] = {}
    if isinstance(data, str):
        body["data"] = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        body["data_base64"] = base64.b64encode(bytes(data)).decode("ascii")
    elif data is not None:
        raise InvalidArgumentError(f"stdin data {type(data).__name__}: give str or bytes")
    if eof:
        body["eof"] = True
    return _api.Call("POST", _api.sandbox_path(sandbox_id, f"/processes/{int(pid)}/stdin"), json=body)


def output_call(sandbox_id: str, pid: int, replay: bool = False) -> _api.Call:
    """The output of process `pid` from now on; with `replay`, what it printed so far first."""
    params = {"replay": "true"} if replay else None
    return _api.Call("GET", _api.sandbox_path(sandbox_id, f"/processes/{int(pid)}/output"), params=params,
                     timeout=READ_TIMEOUT)


#: Longest a watch may take to be in place in the sandbox.
READY_TIMEOUT = 60.0


def watch_call(sandbox_id: str, path: str, recursive: bool) -> _api.Call:
    params = {"path": path, "recursive": str(bool(recursive)).lower()}
    return _api.Call("GET", _api.sandbox_path(sandbox_id, "/files/watch"), params=params, timeout=READ_TIMEOUT)


class SseParser:
    """Server-sent events, line by line: `feed_line` answers (event, decoded JSON) at the end of each."""

    def __init__(self) -> None:
        self._event, self._data = "message", []  # type: Tuple[str, List[str]]

    def feed_line(self, line: str) -> Optional[Tuple[str, Any]]:
        if line == "":
            event, data = self._event, "\n".join(self._data)
            self._event, self._data = "message", []
            return (event, json.loads(data)) if data else None
        if line.startswith("event:"):
            self._event = line[6:].strip()
        elif line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
        return None


def _typed(e: BaseException, what: str) -> BaseException:
    """The SDK's exception for what ended a follow stream."""
    if isinstance(e, httpx.TimeoutException):
        return TimeoutException(f"{what} stopped sending in time: {e}")
    if isinstance(e, httpx.TransportError):
        return ServiceUnavailableError(f"the connection following {what} broke: {e}")
    if isinstance(e, BranchboxError) and e.status is None and e.code:
        return from_code(e.code, e.message)
    return e


def _socket_of(r: httpx.Response) -> Optional[socket.socket]:
    try:
        return r.extensions["network_stream"].get_extra_info("socket")
    except Exception:
        return None


def _shutdown(sock: Optional[socket.socket]) -> None:
    """Ends a blocking read on the stream's connection, from another thread."""
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


async def _call(cb: Callable[[Any], Any], arg: Any) -> None:
    r = cb(arg)
    if inspect.isawaitable(r):
        await r


class _Output:
    """What a follower of a process's output has seen: text, the callbacks it goes to, the end."""

    def __init__(self, on_stdout: Optional[Callback], on_stderr: Optional[Callback]) -> None:
        self.callbacks: Dict[str, Optional[Callback]] = {"stdout": on_stdout, "stderr": on_stderr}
        self.pending: List[Tuple[str, str]] = []
        self.dec = _api.StreamDecoder(lambda t: self.pending.append(("stdout", t)),
                                      lambda t: self.pending.append(("stderr", t)))

    @property
    def result(self) -> Optional[CommandResult]:
        return self.dec.result

    def feed(self, line: str) -> List[Tuple[Callback, str]]:
        """Feeds a line; answers the callback calls it makes (with the callbacks of now)."""
        self.dec.feed_line(line)
        calls = [(cb, t) for cb, t in ((self.callbacks[n], t) for n, t in self.pending) if cb is not None]
        self.pending = []
        return calls

    def replay(self, on_stdout: Optional[Callback], on_stderr: Optional[Callback]) -> List[Tuple[Callback, str]]:
        """Takes the callbacks given to `wait()`: each new one first gets the output so far."""
        calls = []
        for name, cb in (("stdout", on_stdout), ("stderr", on_stderr)):
            if cb is None or cb is self.callbacks[name]:
                continue
            self.callbacks[name] = cb
            so_far = "".join(self.dec.text[name])
            if so_far:
                calls.append((cb, so_far))
        return calls


class OutputFollower:
    """A background process's output from now on, read by a thread into callbacks and a result."""

    def __init__(self, http: Any, sandbox_id: str, pid: int, on_stdout: Optional[Callback],
                 on_stderr: Optional[Callback], timeout: Optional[float], replay: bool = False) -> None:
        self._what = f"the output of process {pid}"
        self._out = _Output(on_stdout, on_stderr)
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._closing = self._expired = False
        self._timeout = timeout
        self._cm = http.stream(output_call(sandbox_id, pid, replay))
        self._r = self._cm.__enter__()  # raises NotFoundError for a missing process
        self._sock = _socket_of(self._r)
        self._thread = threading.Thread(target=self._run, name=f"branchbox-output-{pid}", daemon=True)
        self._timer = threading.Timer(timeout, self._expire) if timeout else None
        self._thread.start()
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def _run(self) -> None:
        try:
            for line in self._r.iter_lines():
                with self._lock:
                    calls = self._out.feed(line)
                for cb, text in calls:
                    cb(text)
                if self._out.result is not None:
                    break
            if self._out.result is None:
                self._out.dec.finish()  # raises: the stream ended without an exit
        except BaseException as e:
            if self._expired:
                self._error = TimeoutException(f"following {self._what} ran past its timeout of {self._timeout} s")
            elif self._closing:
                self._error = BranchboxError(f"disconnected from {self._what}", code="disconnected")
            else:
                self._error = _typed(e, self._what)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            try:
                self._cm.__exit__(None, None, None)
            except Exception:
                pass

    def _expire(self) -> None:
        if self._thread.is_alive():
            self._expired = True
            _shutdown(self._sock)

    def set_callbacks(self, on_stdout: Optional[Callback], on_stderr: Optional[Callback]) -> None:
        with self._lock:
            calls = self._out.replay(on_stdout, on_stderr)
        for cb, text in calls:
            cb(text)

    def wait(self, timeout: Optional[float]) -> CommandResult:
        """The result once the process ended; `TimeoutException` while it still runs after `timeout`."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutException(f"process was still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._out.result is not None
        return self._out.result

    def close(self) -> None:
        """Stops following (the process runs on)."""
        if self._thread.is_alive():
            self._closing = True
            _shutdown(self._sock)
            self._thread.join(10)


class AsyncOutputFollower:
    """As `OutputFollower`, read by a task; callbacks may be coroutine functions."""

    def __init__(self) -> None:
        self._error: Optional[BaseException] = None

    @classmethod
    async def open(cls, http: Any, sandbox_id: str, pid: int, on_stdout: Optional[Callback],
                   on_stderr: Optional[Callback], timeout: Optional[float],
                   replay: bool = False) -> "AsyncOutputFollower":
        self = cls()
        self._what = f"the output of process {pid}"
        self._out = _Output(on_stdout, on_stderr)
        self._timeout = timeout
        self._cm = http.stream(output_call(sandbox_id, pid, replay))
        self._r = await self._cm.__aenter__()  # raises NotFoundError for a missing process
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _pump(self) -> None:
        async for line in self._r.aiter_lines():
            for cb, text in self._out.feed(line):
                await _call(cb, text)
            if self._out.result is not None:
                return
        self._out.dec.finish()  # raises: the stream ended without an exit

    async def _run(self) -> None:
        try:
            if self._timeout:
                await asyncio.wait_for(self._pump(), self._timeout)
            else:
                await self._pump()
        except asyncio.TimeoutError:
            self._error = TimeoutException(f"following {self._what} ran past its timeout of {self._timeout} s")
        except Exception as e:
            self._error = _typed(e, self._what)
        finally:
            try:
                await self._cm.__aexit__(None, None, None)
            except Exception:
                pass

    async def set_callbacks(self, on_stdout: Optional[Callback], on_stderr: Optional[Callback]) -> None:
        for cb, text in self._out.replay(on_stdout, on_stderr):
            await _call(cb, text)

    async def wait(self, timeout: Optional[float]) -> CommandResult:
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        if not done:
            raise TimeoutException(f"process was still running after {timeout} s")
        if self._task.cancelled():
            raise BranchboxError(f"disconnected from {self._what}", code="disconnected")
        if self._error is not None:
            raise self._error
        assert self._out.result is not None
        return self._out.result

    async def close(self) -> None:
        if not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task})


class WatchHandle:
    """A directory being watched (`files.watch_dir`): a thread collects its changes for
    `get_new_events()` until `stop()`."""

    def __init__(self, http: Any, sandbox_id: str, path: str, recursive: bool) -> None:
        self._path = path
        self._events: List[FilesystemEvent] = []
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._stopped = False
        self._ready = threading.Event()
        self._cm = http.stream(watch_call(sandbox_id, path, recursive))
        self._r = self._cm.__enter__()  # raises: missing (NotFoundError), not a directory (InvalidArgumentError)
        self._sock = _socket_of(self._r)
        self._thread = threading.Thread(target=self._run, name=f"branchbox-watch-{path}", daemon=True)
        self._thread.start()
        # Returns once the watch is in place in the sandbox, so no change made after this call
        # is missed.
        if not self._ready.wait(READY_TIMEOUT):
            self.stop()
            raise TimeoutException(f"the watch of {path} did not start within {READY_TIMEOUT} s")
        if self._error is not None and not self._thread.is_alive():
            raise self._error

    def _run(self) -> None:
        parser = SseParser()
        try:
            for line in self._r.iter_lines():
                ev = parser.feed_line(line)
                if ev is None:
                    continue
                name, d = ev
                if name == "ready":
                    self._ready.set()
                elif name == "change":
                    e = FilesystemEvent.parse(d, self._path)
                    if e is not None:
                        with self._lock:
                            self._events.append(e)
                elif name == "end":
                    return
                elif name == "error":
                    err = d.get("error") or {}
                    raise from_code(err.get("code"), err.get("message", "the watch failed"))
        except BaseException as e:
            if not self._stopped:
                self._error = _typed(e, f"the watch of {self._path}")
        finally:
            self._ready.set()
            try:
                self._cm.__exit__(None, None, None)
            except Exception:
                pass

    @property
    def running(self) -> bool:
        """False once stopped, or once the stream ended (the directory went, or an error)."""
        return self._thread.is_alive()

    def get_new_events(self) -> List[FilesystemEvent]:
        """The changes since the last call (or since the watch began); raises what ended the
        watch once its events are taken."""
        if self._stopped:
            raise BranchboxError("the watch is stopped", code="watch_stopped")
        with self._lock:
            out, self._events = self._events, []
        if not out and self._error is not None:
            raise self._error
        return out

    def stop(self) -> None:
        """Stops watching; `get_new_events()` raises afterwards, as E2B's does."""
        self._stopped = True
        if self._thread.is_alive():
            _shutdown(self._sock)
            self._thread.join(10)

    def __enter__(self) -> "WatchHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncWatchHandle:
    """A directory being watched (`await files.watch_dir(path, on_event)`): a task calls
    `on_event` per change, and `on_exit` (None, or what ended it) at the end; `await stop()`."""

    @classmethod
    async def open(cls, http: Any, sandbox_id: str, path: str, recursive: bool,
                   on_event: Callable[[FilesystemEvent], Any], on_exit: Optional[Callable[[Optional[Exception]], Any]],
                   timeout: Optional[float]) -> "AsyncWatchHandle":
        self = cls()
        self._path, self._on_event, self._on_exit, self._timeout = path, on_event, on_exit, timeout
        self._ready, self._error = asyncio.Event(), None
        self._cm = http.stream(watch_call(sandbox_id, path, recursive))
        self._r = await self._cm.__aenter__()
        self._task = asyncio.ensure_future(self._run())
        # Returns once the watch is in place in the sandbox, so no change made after it is missed.
        try:
            await asyncio.wait_for(self._ready.wait(), READY_TIMEOUT)
        except asyncio.TimeoutError:
            await self.stop()
            raise TimeoutException(f"the watch of {path} did not start within {READY_TIMEOUT} s") from None
        if self._error is not None and self._task.done():
            raise self._error
        return self

    async def _pump(self) -> None:
        parser = SseParser()
        async for line in self._r.aiter_lines():
            ev = parser.feed_line(line)
            if ev is None:
                continue
            name, d = ev
            if name == "ready":
                self._ready.set()
            elif name == "change":
                e = FilesystemEvent.parse(d, self._path)
                if e is not None:
                    await _call(self._on_event, e)
            elif name == "end":
                return
            elif name == "error":
                err = d.get("error") or {}
                raise from_code(err.get("code"), err.get("message", "the watch failed"))

    async def _exit(self, error: Optional[Exception]) -> None:
        if self._on_exit is not None:
            try:
                await _call(self._on_exit, error)
            except Exception:
                pass  # nowhere to raise it from a task

    async def _run(self) -> None:
        error: Optional[Exception] = None
        try:
            if self._timeout:
                await asyncio.wait_for(self._pump(), self._timeout)
            else:
                await self._pump()
        except asyncio.CancelledError:
            await self._exit(None)
            raise
        except asyncio.TimeoutError:
            error = TimeoutException(f"the watch of {self._path} ran past its timeout of {self._timeout} s")
        except Exception as e:
            error = _typed(e, f"the watch of {self._path}")  # type: ignore[assignment]
        finally:
            self._error = error
            self._ready.set()
            try:
                await self._cm.__aexit__(None, None, None)
            except Exception:
                pass
        await self._exit(error)

    @property
    def running(self) -> bool:
        return not self._task.done()

    async def stop(self) -> None:
        """Stops watching (`on_exit` gets None)."""
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})
