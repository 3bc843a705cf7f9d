"""UDP to a networked sandbox's exposed port through branchboxd: `GET
/v1/sandboxes/{id}/udp/{port}`, a WebSocket, behind `sandbox.udp(port)`.

Each binary message is one datagram: the service sends it to the port from its side of the
sandbox's network, and each datagram the port sends back arrives as one message. The service
ends a relay after 120 s without a datagram either way, and closes it (code 1008) on a text
message or one over 65,507 bytes; `send` refuses both before they leave.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Type, Union

from . import _api
from ._pty import connect_error, websocket_request
from .exceptions import BranchboxError, InvalidArgumentError, TimeoutException

if TYPE_CHECKING:
    from types import TracebackType

    from .async_sandbox import AsyncSandbox
    from .sandbox import Sandbox

#: The largest datagram relayed (the most a UDP datagram over IPv4 carries).
MAX_DATAGRAM = 65507
#: Datagrams a connection holds unread before it stops reading the socket (the service then
#: stops reading the port, and the sandbox's further datagrams are dropped, as UDP's are).
MAX_QUEUE = 128
#: How long closing waits for the service's answer before the connection is dropped.
CLOSE_TIMEOUT = 5.0

Data = Union[bytes, bytearray, memoryview]


def _request(sandbox: Any, port: int) -> Tuple[str, Dict[str, str], str]:
    return websocket_request(sandbox, _api.udp_path(sandbox.sandbox_id, port))


def _datagram(data: Data) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"a datagram is bytes, not {type(data).__name__}")
    b = bytes(data)
    if len(b) > MAX_DATAGRAM:
        raise InvalidArgumentError(f"a datagram is at most {MAX_DATAGRAM} bytes, not {len(b)}", code="too_large")
    return b


def _closed(e: BaseException, port: int) -> BranchboxError:
    """The error of a relay the service or the client closed, with the service's reason."""
    frame = getattr(e, "rcvd", None)
    why = f": {frame.reason} (close code {frame.code})" if frame is not None and frame.reason else ""
    return BranchboxError(f"the UDP relay to port {port} has closed{why}", code="udp_closed")


class UdpRelay:
    """Datagrams to and from one UDP port of a networked sandbox, through branchboxd; from
    `sandbox.udp(port)`. A context manager: leaving it closes the relay."""

    def __init__(self, ws: Any, port: int) -> None:
        self._ws = ws
        #: The sandbox's port.
        self.port = port

    def __repr__(self) -> str:
        return f"UdpRelay(port={self.port})"

    def send(self, data: Data) -> None:
        """Sends `data` (at most 65,507 bytes) as one datagram to the port."""
        from websockets.exceptions import ConnectionClosed

        b = _datagram(data)
        try:
            self._ws.send(b)
        except ConnectionClosed as e:
            raise _closed(e, self.port) from None

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next datagram from the port. Raises `TimeoutException` when none came within
        `timeout` seconds (None: wait), and `BranchboxError` (code `udp_closed`, with the
        service's reason) once the relay has closed."""
        from websockets.exceptions import ConnectionClosed

        try:
            return self._ws.recv(timeout=timeout, decode=False)
        except TimeoutError:
            raise TimeoutException(f"no datagram from port {self.port} within {timeout} s") from None
        except ConnectionClosed as e:
            raise _closed(e, self.port) from None

    def close(self) -> None:
        """Closes the relay (the service's socket for it goes with it)."""
        self._ws.close()

    def __enter__(self) -> "UdpRelay":
        return self

    def __exit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException], tb: "Optional[TracebackType]") -> None:
        self.close()


def open_relay(sandbox: "Sandbox", port: int, request_timeout: Optional[float]) -> UdpRelay:
    """Opens a relay to `port` of `sandbox` (see `Sandbox.udp`)."""
    url, headers, agent = _request(sandbox, port)
    from websockets.sync.client import connect

    cfg = sandbox._http.cfg
    try:
        # Entered as a context manager, as the terminal's (17.1 deprecates a bare connect()).
        ws = connect(url, additional_headers=headers, user_agent_header=agent, compression=None,
                     open_timeout=request_timeout if request_timeout is not None else cfg.request_timeout,
                     close_timeout=CLOSE_TIMEOUT, ping_interval=None, max_size=MAX_DATAGRAM,
                     max_queue=MAX_QUEUE).__enter__()
    except Exception as e:
        raise connect_error(e, cfg.api_url, "UDP relay") from e
    return UdpRelay(ws, port)


class AsyncUdpRelay:
    """`UdpRelay` for asyncio, from `await sandbox.udp(port)`; an async context manager."""

    def __init__(self, ws: Any, port: int) -> None:
        self._ws = ws
        #: The sandbox's port.
        self.port = port

    def __repr__(self) -> str:
        return f"AsyncUdpRelay(port={self.port})"

    async def send(self, data: Data) -> None:
        """As `UdpRelay.send`."""
        from websockets.exceptions import ConnectionClosed

        b = _datagram(data)
        try:
            await self._ws.send(b)
        except ConnectionClosed as e:
            raise _closed(e, self.port) from None

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        """As `UdpRelay.recv` (a datagram is never lost to the timeout)."""
        from websockets.exceptions import ConnectionClosed

        try:
            return await asyncio.wait_for(self._ws.recv(decode=False), timeout)
        except asyncio.TimeoutError:
            raise TimeoutException(f"no datagram from port {self.port} within {timeout} s") from None
        except ConnectionClosed as e:
            raise _closed(e, self.port) from None

    async def close(self) -> None:
        """As `UdpRelay.close`."""
        await self._ws.close()

    async def __aenter__(self) -> "AsyncUdpRelay":
        return self

    async def __aexit__(self, t: Optional[Type[BaseException]], v: Optional[BaseException],
                        tb: "Optional[TracebackType]") -> None:
        await self.close()


async def open_async_relay(sandbox: "AsyncSandbox", port: int, request_timeout: Optional[float]) -> AsyncUdpRelay:
    """Opens a relay to `port` of `sandbox` (see `AsyncSandbox.udp`)."""
    url, headers, agent = _request(sandbox, port)
    from websockets.asyncio.client import connect

    cfg = sandbox._http.cfg
    try:
        ws = await connect(url, additional_headers=headers, user_agent_header=agent, compression=None,
                           open_timeout=request_timeout if request_timeout is not None else cfg.request_timeout,
                           close_timeout=CLOSE_TIMEOUT, ping_interval=None, max_size=MAX_DATAGRAM,
                           max_queue=MAX_QUEUE)
    except Exception as e:
        raise connect_error(e, cfg.api_url, "UDP relay") from e
    return AsyncUdpRelay(ws, port)
