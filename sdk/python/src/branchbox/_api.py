"""The HTTP calls, described once: each function returns a `Call` that the sync and async
clients send with their own transport; answers are checked here too."""

from __future__ import annotations

import base64
import codecs
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote, urlencode

import httpx

from ._names import check_name, check_snapshot_ref
from .exceptions import (BranchboxError, CommandExitException, CommandTimeoutException, InvalidArgumentError,
                         from_response)
from .models import CommandResult

#: Extra seconds a command's HTTP request waits beyond the command's own timeout.
COMMAND_MARGIN = 30.0


@dataclass
class Call:
    """One HTTP request."""

    method: str
    path: str
    json: Any = None
    params: Optional[Dict[str, Any]] = None
    content: Any = None
    timeout: Optional[float] = None
    headers: Optional[Dict[str, str]] = None


#: Methods safe to send again when a pooled connection turns out to be closed.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})


def _q(s: str) -> str:
    return quote(s, safe="")


def sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{_q(sandbox_id)}{rest}"


def snapshot_body(name: Optional[str]) -> Dict[str, Any]:
    """The body that takes a snapshot or checkpoint, its name checked first."""
    return {} if name is None else {"name": check_name("snapshot name", name)}


def rollback(sandbox_id: str, checkpoint: str) -> Call:
    return Call("POST", sandbox_path(sandbox_id, "/rollback"), json={"checkpoint": check_snapshot_ref(checkpoint)})


def delete_snapshot(snapshot: str, cascade: bool) -> Call:
    path = f"/v1/snapshots/{_q(check_snapshot_ref(snapshot))}"
    return Call("DELETE", path, params={"cascade": str(cascade).lower()})


#: Seconds a push or pull of a snapshot may take (its bytes travel to or from S3).
TRANSFER_TIMEOUT = 3600.0


def push_snapshot(snapshot: str) -> Call:
    """Pushes a snapshot to the service's S3 store (docs/remote.md)."""
    return Call("POST", f"/v1/snapshots/{_q(check_snapshot_ref(snapshot))}/push", timeout=TRANSFER_TIMEOUT)


def pull_snapshot(snapshot_id: str, peer: Optional[str]) -> Call:
    """Pulls a pushed snapshot into the service, from peer node `peer` first when named."""
    body = compact({"id": check_snapshot_ref(snapshot_id), "peer": peer})
    return Call("POST", "/v1/snapshots/pull", json=body, timeout=TRANSFER_TIMEOUT)


def fleet_capacity() -> Call:
    """How much room the service has for new sandboxes (what a full fleet peer asks before it
    passes a create on)."""
    return Call("GET", "/v1/fleet/capacity")


def gc(dry_run: bool) -> Call:
    """A report of what gc would free (``dry_run``), or the collection itself."""
    return Call("GET" if dry_run else "POST", "/v1/gc")


def compact(body: Dict[str, Any]) -> Dict[str, Any]:
    """A request body without the fields left out (None): the service applies its defaults."""
    return {k: v for k, v in body.items() if v is not None}


def create(
    template: Optional[str],
    snapshot_id: Optional[str],
    timeout: Optional[float],
    on_timeout: Optional[str],
    metadata: Optional[Mapping[str, str]],
    envs: Optional[Mapping[str, str]],
    backend: Optional[str],
    memory_mib: Optional[int],
    cpus: Optional[int],
    pids: Optional[int],
    image: Optional[str] = None,
    network: Optional[Mapping[str, Any]] = None,
    allow_internet_access: Optional[bool] = None,
    open_ports: Optional[bool] = None,
) -> Call:
    if snapshot_id is not None:
        check_snapshot_ref(snapshot_id)
    body = {
        "template": template,
        "snapshot_id": snapshot_id,
        "timeout": timeout,
        "on_timeout": on_timeout,
        "metadata": dict(metadata) if metadata is not None else None,
        "envs": dict(envs) if envs is not None else None,
        "backend": backend,
        "memory_mib": memory_mib,
        "cpus": cpus,
        "pids": pids,
        "image": image,
        "network": dict(network) if network is not None else None,
        "allow_internet_access": allow_internet_access,
        "open_ports": open_ports,
    }
    return Call("POST", "/v1/sandboxes", json=compact(body))


def network_policy(mode: str, allow: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The service's policy object: `mode` "internet", "deny_all" or "allow_list" (with `allow`,
    the IPv4 networks and host names it may reach, at most 256)."""
    if mode not in ("internet", "deny_all", "allow_list"):
        raise InvalidArgumentError(f"network mode {mode!r}: give 'internet', 'deny_all' or 'allow_list'")
    return compact({"mode": mode, "allow": list(allow) if allow is not None else None})


def _port(port: int) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise InvalidArgumentError(f"port {port!r}: give 1 to 65535")
    return port


def host_path(sandbox_id: str, port: int) -> str:
    return sandbox_path(sandbox_id, f"/hosts/{_port(port)}")


def udp_path(sandbox_id: str, port: int) -> str:
    return sandbox_path(sandbox_id, f"/udp/{_port(port)}")


def list_sandboxes(metadata: Optional[Mapping[str, str]], state: Optional[str], local: bool = False) -> Call:
    """The listing: through a node with fleet peers, every node's sandboxes unless `local`."""
    params: Dict[str, Any] = {}
    if metadata:
        params["metadata"] = urlencode(dict(metadata))
    if state:
        params["state"] = state
    if local:
        params["local"] = "true"
    return Call("GET", "/v1/sandboxes", params=params)


#: The answer header of a fleet listing naming the peers whose sandboxes it lacks.
UNANSWERED_HEADER = "x-branchbox-peers-unanswered"
#: One `NAME (REASON)` of that header: a peer name as peers files allow it, then the reason up
#: to the next `, NAME (` or the end.
_UNANSWERED_ITEM = re.compile(r"([A-Za-z0-9._-]{1,64}) \((.*?)\)(?:, (?=[A-Za-z0-9._-]{1,64} \()|$)")


def unanswered_peers(r: httpx.Response) -> Dict[str, str]:
    """The peers a fleet listing's answer names as unanswered, each with why (empty when every
    peer answered, or the service has none). A header that does not read as `NAME (REASON), ...`
    is kept whole, under the name "?", rather than dropped."""
    raw = r.headers.get(UNANSWERED_HEADER, "").strip()
    if not raw:
        return {}
    found: Dict[str, str] = {}
    at = 0
    while at < len(raw):
        m = _UNANSWERED_ITEM.match(raw, at)
        if m is None:
            return {"?": raw}
        found[m.group(1)] = m.group(2)
        at = m.end()
    return found


def command_body(
    cmd: Union[str, Sequence[str]],
    envs: Optional[Mapping[str, str]],
    cwd: Optional[str],
    timeout: Optional[float],
    stdin: Optional[str] = None,
    user: Optional[str] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if user is not None:
        body["user"] = user
    if envs:
        body["envs"] = dict(envs)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeout"] = timeout
    if stdin is not None:
        body["stdin"] = stdin
    return body


def command_http_timeout(timeout: Optional[float], default: float = 60.0) -> float:
    return (timeout if timeout is not None else default) + COMMAND_MARGIN


def error_of(status: int, body: Optional[bytes], reason: Optional[str] = None) -> BranchboxError:
    """The typed exception for an error answer: its status, and the code and message of the
    service's error body when it has one."""
    code, message = None, reason or f"HTTP {status}"
    try:
        err = json.loads(body or b"")["error"]
        code, message = err.get("code"), err.get("message", message)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return from_response(status, code, message)


def raise_for(r: httpx.Response) -> None:
    """Raises the typed exception for an error answer."""
    if r.status_code < 400:
        return
    raise error_of(r.status_code, r.content, r.reason_phrase)


def check_exit(result: CommandResult, cmd: Union[str, Sequence[str]]) -> CommandResult:
    """Returns the result, or raises `CommandExitException` when the command failed."""
    if result.exit_code == 0:
        return result
    if result.timed_out:
        why = "timed out and its process group was killed"
    elif result.oom_killed:
        why = "had a process killed at the sandbox's memory limit"
    elif result.exit_code is None:
        why = f"was killed by signal {result.signal}"
    else:
        why = f"exited with code {result.exit_code}"
    shown = cmd if isinstance(cmd, str) else " ".join(cmd)
    kind = CommandTimeoutException if result.timed_out else CommandExitException
    raise kind(
        f"command {shown[:200]!r} {why}: {result.stderr[-500:]}",
        stdout=result.stdout,
        stderr=result.stderr,
        exit_code=result.exit_code,
        signal=result.signal,
        timed_out=result.timed_out,
        oom_killed=result.oom_killed,
    )


class StreamDecoder:
    """Turns the server-sent events of a streamed command into callbacks and a result."""

    def __init__(self, on_stdout: Optional[Callable[[str], Any]], on_stderr: Optional[Callable[[str], Any]]) -> None:
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in self.callbacks}
        self.text: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        self.result: Optional[CommandResult] = None
        self._event = "message"
        self._data: List[str] = []

    def _emit(self, name: str, text: str) -> None:
        if not text:
            return
        self.text[name].append(text)
        cb = self.callbacks.get(name)
        if cb is not None:
            cb(text)

    def _dispatch(self) -> None:
        event, data = self._event, "\n".join(self._data)
        self._event, self._data = "message", []
        if not data:
            return
        payload = json.loads(data)
        if event in ("stdout", "stderr"):
            self._emit(event, self.decoders[event].decode(base64.b64decode(payload["data"])))
        elif event == "exit":
            for name, dec in self.decoders.items():
                self._emit(name, dec.decode(b"", final=True))
            self.result = CommandResult.parse(payload, "".join(self.text["stdout"]), "".join(self.text["stderr"]))
        elif event == "error":
            err = payload.get("error", {})
            raise BranchboxError(err.get("message", "the command failed"), status=None, code=err.get("code"))

    def feed_line(self, line: str) -> None:
        """Feeds one line of the event stream (without its line ending)."""
        if line == "":
            self._dispatch()
        elif line.startswith(":"):
            return
        elif line.startswith("event:"):
            self._event = line[6:].strip()
        elif line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))

    def finish(self) -> CommandResult:
        """The result, once the stream ended."""
        self._dispatch()
        if self.result is None:
            raise BranchboxError("the command's output stream ended before its exit status", code="stream_cut")
        return self.result
