"""Streamed file reads (`files.read(path, format="stream")`): iterators over byte chunks that
close their connection when exhausted, closed, or left in a `with` block."""

from __future__ import annotations

from typing import Any, Iterator

import httpx


class ByteStream(Iterator[bytes]):
    """The chunks of a file as they arrive (`files.read(format="stream")`); the connection
    closes when they are exhausted, on `close()`, or at the end of a `with` block."""

    def __init__(self, cm: Any) -> None:
        self._cm: Any = cm
        self._chunks = cm.__enter__().iter_bytes()

    def __iter__(self) -> "ByteStream":
        return self

    def __next__(self) -> bytes:
        if self._cm is None:
            raise StopIteration
        try:
            return next(self._chunks)
        except StopIteration:
            self.close()
            raise
        except Exception as e:
            cm, self._cm = self._cm, None
            # The stream's own handler turns a transport error into the SDK's exception.
            if not cm.__exit__(type(e), e, e.__traceback__):
                raise
            raise StopIteration from e

    def close(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def __enter__(self) -> "ByteStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class AsyncByteStream:
    """The chunks of a file as they arrive (`await files.read(path, format="stream")`); the
    connection closes when they are exhausted, on `aclose()`, or at the end of `async with`."""

    def __init__(self, cm: Any, r: httpx.Response) -> None:
        self._cm: Any = cm
        self._chunks = r.aiter_bytes()

    def __aiter__(self) -> "AsyncByteStream":
        return self

    async def __anext__(self) -> bytes:
        if self._cm is None:
            raise StopAsyncIteration
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise
        except Exception as e:
            cm, self._cm = self._cm, None
            # The stream's own handler turns a transport error into the SDK's exception.
            if not await cm.__aexit__(type(e), e, e.__traceback__):
                raise
            raise StopAsyncIteration from e

    async def aclose(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def __aenter__(self) -> "AsyncByteStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
