"""Templates: a base and steps, each step's result a cached snapshot on the service
(docs/templates.md). Build, list, get, delete, and the last build's log; start sandboxes from
one with `Sandbox.create(template="name")`.

Over HTTP files travel inline: a step is a dict with exactly one of `run` (a shell line or an
argv list), `file` (a path, with `content` and optional `mode` as an octal string), `env` (a
dict), `workdir`, `user`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence
from urllib.parse import quote

from . import _api
from ._config import ConnectionConfig
from ._names import check_name
from .exceptions import BranchboxError
from ._http import _Http


@dataclass
class TemplateInfo:
    """A template and its last build."""

    name: str
    base: str
    steps: int
    state: str
    snapshot: Optional[str]
    failed_step: Optional[int] = None
    exit_code: Optional[int] = None
    build_ms: int = 0
    record: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> "TemplateInfo":
        return cls(d["name"], d["base"], int(d["steps"]), d["state"], d.get("snapshot"), d.get("failed_step"),
                   d.get("exit_code"), int(d.get("build_ms") or 0), dict(d.get("record") or {}))

    def step_snapshots(self) -> List[Optional[str]]:
        """The snapshot after each step of the last build (None where it stopped before)."""
        return [s.get("snapshot") for s in self.record.get("steps", [])]


def _path(name: str, rest: str = "") -> str:
    return f"/v1/templates/{quote(check_name('template name', name), safe='')}{rest}"


class Templates:
    """Template operations; each call opens its own connection to the service."""

    @staticmethod
    def build(name: str, steps: Sequence[Mapping[str, Any]], base: Optional[str] = None, *,
              on_event: Optional[Callable[[str, Dict[str, Any]], Any]] = None,
              api_url: Optional[str] = None, token: Optional[str] = None,
              request_timeout: Optional[float] = 3600.0) -> TemplateInfo:
        """Builds a template, reusing every cached step before the first changed one.
        `on_event(name, data)` sees `step`, `output` and `step_done` events as they come. A failed
        step raises `BranchboxError` naming the step and its exit code."""
        body: Dict[str, Any] = {"name": check_name("template name", name), "steps": [dict(s) for s in steps]}
        if base is not None:
            body["base"] = base
        http = _Http(ConnectionConfig.resolve(api_url, token, request_timeout))
        state: Dict[str, Any] = {"event": "message", "data": [], "done": None}

        def feed(line: str) -> None:
            if line.startswith("event:"):
                state["event"] = line[6:].strip()
            elif line.startswith("data:"):
                state["data"].append(line[5:].lstrip(" "))
            elif line == "" and state["data"]:
                payload = json.loads("\n".join(state["data"]))
                name = state["event"]
                state["event"], state["data"] = "message", []
                if name == "done":
                    state["done"] = TemplateInfo.parse(payload)
                elif name == "error":
                    err = payload.get("error", {})
                    raise BranchboxError(err.get("message", "the build failed"), code=err.get("code"))
                elif on_event is not None:
                    on_event(name, payload)

        try:
            with http.stream(_api.Call("POST", "/v1/templates", json=body, timeout=request_timeout)) as r:
                for line in r.iter_lines():
                    feed(line)
                feed("")
        finally:
            http.client.close()
        done: Optional[TemplateInfo] = state["done"]
        if done is None:
            raise BranchboxError("the build's event stream ended before its result", code="stream_cut")
        return done

    @staticmethod
    def _call(c: _api.Call, api_url: Optional[str], token: Optional[str]) -> Any:
        http = _Http(ConnectionConfig.resolve(api_url, token))
        try:
            r = http.call(c)
            return None if r.status_code == 204 else r
        finally:
            http.client.close()

    @staticmethod
    def list(*, api_url: Optional[str] = None, token: Optional[str] = None) -> List[TemplateInfo]:
        """Every template."""
        r = Templates._call(_api.Call("GET", "/v1/templates"), api_url, token)
        return [TemplateInfo.parse(d) for d in r.json()]

    @staticmethod
    def get(name: str, *, api_url: Optional[str] = None, token: Optional[str] = None) -> TemplateInfo:
        """One template."""
        return TemplateInfo.parse(Templates._call(_api.Call("GET", _path(name)), api_url, token).json())

    @staticmethod
    def delete(name: str, *, api_url: Optional[str] = None, token: Optional[str] = None) -> None:
        """Removes a template and releases its cached steps."""
        Templates._call(_api.Call("DELETE", _path(name)), api_url, token)

    @staticmethod
    def log(name: str, *, api_url: Optional[str] = None, token: Optional[str] = None) -> str:
        """The log of the template's last build."""
        return Templates._call(_api.Call("GET", _path(name, "/log")), api_url, token).text
