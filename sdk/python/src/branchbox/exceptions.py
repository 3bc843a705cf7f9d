"""Typed exceptions: one class per kind of failure, each carrying the service's stable code."""

from __future__ import annotations

from typing import Dict, Optional


class BranchboxError(Exception):
    """Any failure reported by the SDK or the service."""

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class AuthenticationError(BranchboxError):
    """The token is missing or wrong (401)."""


class InvalidArgumentError(BranchboxError):
    """The request was malformed (400) or a value is not acceptable (422)."""


class NotFoundError(BranchboxError):
    """No such sandbox, snapshot, file or route (404)."""


class ConflictError(BranchboxError):
    """The object's state does not allow the operation, e.g. a paused sandbox (409)."""


class PermissionDeniedError(BranchboxError):
    """The sandbox refused a file operation (403)."""


class PayloadTooLargeError(BranchboxError):
    """A body or stream is over the service's limit (413)."""


class CapacityError(BranchboxError):
    """The service runs as many sandboxes as it may (503, code `at_capacity`)."""


class ServiceUnavailableError(BranchboxError):
    """The service or a backend is unavailable (503), or cannot be reached at all."""


class TimeoutException(BranchboxError):
    """A request or operation did not finish in time."""


class ServerError(BranchboxError):
    """The service failed (5xx)."""


class CommandExitException(BranchboxError):
    """A command ended with a non-zero exit code, a signal or its timeout."""

    def __init__(
        self,
        message: str,
        *,
        stdout: str,
        stderr: str,
        exit_code: Optional[int],
        signal: Optional[int] = None,
        timed_out: bool = False,
        oom_killed: bool = False,
    ) -> None:
        super().__init__(message, code="command_exit")
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.signal = signal
        self.timed_out = timed_out
        self.oom_killed = oom_killed

    @property
    def error(self) -> str:
        """Standard error of the command."""
        return self.stderr


class CommandTimeoutException(CommandExitException, TimeoutException):
    """A command ran past its timeout and its process group was killed. Both a
    `TimeoutException` (as E2B raises) and a `CommandExitException` (as this SDK raised
    before), so either `except` clause catches it."""


_BY_STATUS = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidArgumentError,
    503: ServiceUnavailableError,
    504: TimeoutException,
}


def from_response(status: int, code: Optional[str], message: str) -> BranchboxError:
    """The exception for an error answer of the service."""
    if status == 503 and code == "at_capacity":
        return CapacityError(message, status=status, code=code)
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else BranchboxError)
    return cls(message, status=status, code=code)


#: The status each stable code is answered with, for errors that come without one (inside a
#: stream or a WebSocket).
_STATUS_OF_CODE = {
    "invalid_id": 400, "invalid_port": 400, "bad_json": 400, "bad_query": 400, "bad_body": 400, "bad_host": 400,
    "invalid_size": 400, "bad_message": 400,
    "unauthorized": 401,
    "permission_denied": 403, "host_not_allowed": 403, "origin_not_allowed": 403,
    "not_found": 404, "path_not_found": 404,
    "conflict": 409, "lost": 409, "already_exists": 409,
    "too_large": 413,
    "invalid_body": 422, "invalid_input": 422, "spawn_failed": 422, "sandbox_io": 422,
    "backend": 502, "agent_unavailable": 502, "port_unreachable": 502, "port_failed": 502,
    "at_capacity": 503, "unavailable": 503, "too_many_connections": 503,
    "timeout": 504,
}


def from_code(code: Optional[str], message: str) -> BranchboxError:
    """The exception for an error that came with a code but no status."""
    status = _STATUS_OF_CODE.get(code) if code is not None else None
    if status is None:
        return BranchboxError(message, code=code)
    return from_response(status, code, message)


class PartialListWarning(UserWarning):
    """A fleet listing lacks the sandboxes of peers that did not answer (the service's
    `X-Branchbox-Peers-Unanswered` header). `unanswered` maps each such peer's name to why."""

    def __init__(self, unanswered: Dict[str, str]) -> None:
        shown = ", ".join(f"{n} ({why})" for n, why in unanswered.items())
        super().__init__(f"the listing lacks the sandboxes of fleet peers that did not answer: {shown}")
        self.unanswered = dict(unanswered)
