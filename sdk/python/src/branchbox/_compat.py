"""What E2B's SDK does that ours does too: the default account, relative paths, class-or-instance
methods, the sandbox paginator, several-file writes and metrics. Shared by the sync and async
clients."""

from __future__ import annotations

import functools
import posixpath
import warnings
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Type, TypeVar, Union

import httpx

from . import _api
from .exceptions import BranchboxError, InvalidArgumentError, PartialListWarning
from .models import SandboxInfo, SandboxMetrics

#: The account commands and file operations use unless told otherwise, as in E2B: the default
#: image has it, with home /home/user and passwordless sudo.
DEFAULT_USER = "user"
#: E2B's name for its default template; here the default image.
BASE_TEMPLATE = "base"


def default_user(user: Optional[str], template: Optional[str], image: Optional[str] = None) -> Optional[str]:
    """The account a sandbox's commands and files use when a call names none: the one chosen
    at create, else `user`; None (the service's default: root, or the template's own user) for
    a sandbox of a named template or of another image than the default, which may have no
    `user` account."""
    if user:
        return user
    if template not in (None, BASE_TEMPLATE, "default") or image not in (None, "default"):
        return None
    return DEFAULT_USER


def home_of(user: Optional[str]) -> str:
    """The home directory relative paths resolve against (the image's convention; root's
    when no user is named)."""
    return "/root" if user in (None, "root") else f"/home/{user}"


def resolve_path(path: str, user: Optional[str]) -> str:
    """An absolute path as is; a relative one under the user's home, as E2B resolves it."""
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"path {path!r} must be a non-empty string")
    return path if path.startswith("/") else posixpath.join(home_of(user), path)


def template_name(template: Optional[str]) -> Optional[str]:
    """The template to ask the service for: E2B's `base` is the default image."""
    return "default" if template == BASE_TEMPLATE else template


def token_of(api_key: Optional[str], token: Optional[str]) -> Optional[str]:
    """`api_key` (E2B's name) and `token` name the same credential; both given must agree."""
    if api_key is not None and token is not None and api_key != token:
        raise InvalidArgumentError("api_key and token are the same credential: give one of them")
    return api_key if api_key is not None else token


def write_entries(
    path_or_files: Union[str, Iterable[Mapping[str, Any]]], data: Any
) -> Tuple[bool, List[Tuple[str, Any]]]:
    """Normalises `files.write(path, data)` and `files.write([{"path", "data"}, ...])`: whether
    a list was given, and the (path, data) pairs."""
    if isinstance(path_or_files, str):
        if data is None:
            raise InvalidArgumentError(f"files.write({path_or_files!r}) needs the data to write")
        return False, [(path_or_files, data)]
    if data is not None:
        raise InvalidArgumentError("give either a path and data, or a list of {'path', 'data'} entries")
    out = []
    for i, e in enumerate(path_or_files):
        p = e.get("path") if isinstance(e, Mapping) else getattr(e, "path", None)
        d = e.get("data") if isinstance(e, Mapping) else getattr(e, "data", None)
        if not isinstance(p, str) or d is None:
            raise InvalidArgumentError(f"entry {i} of the files to write needs a string 'path' and 'data'")
        out.append((p, d))
    return True, out


class class_or_instance:
    """A method that works on an instance (`sbx.kill()`) and on the class with a sandbox id
    (`Sandbox.kill(sandbox_id)`), as E2B's SDK has them: the class form is `on_class`."""

    def __init__(self, on_instance: Callable[..., Any]) -> None:
        self._on_instance = on_instance
        self._on_class: Optional[Callable[..., Any]] = None
        functools.update_wrapper(self, on_instance)  # type: ignore[arg-type]

    def on_class(self, fn: Callable[..., Any]) -> "class_or_instance":
        self._on_class = fn
        return self

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        if obj is None:
            if self._on_class is None:
                raise AttributeError(f"{self._on_instance.__name__} needs a sandbox instance")
            return functools.partial(self._on_class, owner)
        return functools.partial(self._on_instance, obj)


class SandboxPaginator(List[SandboxInfo]):
    """What `Sandbox.list()` returns: the sandboxes (a list, as before) and E2B's paginator
    surface (`has_next`, `next_token`, `next_items()`). The service answers in one page, so the
    first `next_items()` returns them all and `has_next` becomes false. `unanswered_peers`
    names the fleet peers whose sandboxes a listing through a node with peers lacks, each with
    why (empty when it is whole)."""

    def __init__(self, items: Iterable[SandboxInfo], unanswered_peers: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(items)
        self.has_next = True
        self.next_token: Optional[str] = None
        self.unanswered_peers: Dict[str, str] = dict(unanswered_peers or {})

    def next_items(self) -> List[SandboxInfo]:
        if not self.has_next:
            raise BranchboxError("no more sandboxes to list: check has_next before next_items()")
        self.has_next = False
        return list(self)


P = TypeVar("P", bound=SandboxPaginator)


def listing(paginator: Type[P], r: httpx.Response, states: Optional[List[str]]) -> P:
    """The paginator of a listing's answer, the states kept that were asked for; a listing that
    lacks unanswered peers' sandboxes says so with `PartialListWarning` as well as in
    `unanswered_peers`, so that a partial fleet is never taken for a whole one unnoticed."""
    found = [SandboxInfo.parse(d) for d in r.json()]
    missing = _api.unanswered_peers(r)
    if missing:
        warnings.warn(PartialListWarning(missing), stacklevel=3)
    return paginator((i for i in found if states is None or i.state in states), missing)


def list_filters(
    query: Any, metadata: Optional[Mapping[str, str]], state: Optional[str]
) -> Tuple[Optional[Mapping[str, str]], Optional[str], Optional[List[str]]]:
    """E2B's `query=SandboxQuery(metadata=..., state=[...])`, or a dict of the same, merged with
    our `metadata=`/`state=` arguments: the metadata and the one state the service filters
    on, and the states kept when several are asked for (filtered here)."""
    if query is None:
        return metadata, state, None
    get = query.get if isinstance(query, Mapping) else (lambda k: getattr(query, k, None))
    q_meta, q_state = get("metadata"), get("state")
    meta = q_meta if q_meta is not None else metadata
    if q_state is None:
        return meta, state, None
    if isinstance(q_state, str):
        return meta, q_state, None
    states = [str(getattr(s, "value", s)) for s in q_state]
    if len(states) == 1:
        return meta, states[0], None
    return meta, None, states


#: Read by `get_metrics` in the sandbox: memory, CPUs, two CPU-time samples 0.1 s apart, disk.
METRICS_SCRIPT = (
    "cat /proc/meminfo; echo @cpus $(nproc); echo @stat $(head -n1 /proc/stat); sleep 0.1; "
    "echo @stat $(head -n1 /proc/stat); echo @df $(df -kP / | tail -n1)"
)


def parse_metrics(out: str) -> SandboxMetrics:
    """The metrics in the output of `METRICS_SCRIPT`; a figure the sandbox did not give is None."""
    mem: Dict[str, int] = {}
    cpus: Optional[int] = None
    stats: List[List[int]] = []
    disk: Optional[Tuple[int, int]] = None
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].endswith(":") and len(parts) >= 2 and parts[1].isdigit():
            mem[parts[0][:-1]] = int(parts[1]) * 1024
        elif parts[0] == "@cpus" and len(parts) == 2 and parts[1].isdigit():
            cpus = int(parts[1])
        elif parts[0] == "@stat" and len(parts) > 5:
            stats.append([int(x) for x in parts[2:] if x.isdigit()])
        elif parts[0] == "@df" and len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            used, avail = int(parts[2]) * 1024, int(parts[3]) * 1024
            disk = (used, used + avail)
    cpu_pct: Optional[float] = None
    if len(stats) == 2 and len(stats[0]) >= 4 and len(stats[1]) >= 4:
        total = sum(stats[1]) - sum(stats[0])
        # idle and iowait are the 4th and 5th fields.
        idle = sum(stats[1][3:5]) - sum(stats[0][3:5])
        cpu_pct = round(100.0 * (total - idle) / total, 2) if total > 0 else 0.0
    total_mem = mem.get("MemTotal")
    avail_mem = mem.get("MemAvailable", mem.get("MemFree"))
    used_mem = total_mem - avail_mem if total_mem is not None and avail_mem is not None else None
    return SandboxMetrics(
        timestamp=datetime.now(timezone.utc),
        cpu_count=cpus,
        cpu_used_pct=cpu_pct,
        mem_total=total_mem,
        mem_used=used_mem,
        disk_total=disk[1] if disk else None,
        disk_used=disk[0] if disk else None,
    )


def with_template(info: SandboxInfo, template: Optional[str]) -> SandboxInfo:
    """The info with the template this client created it from, when it knows it."""
    if template is None:
        return info
    return SandboxInfo(**{**info.__dict__, "template_id": template, "name": template})
