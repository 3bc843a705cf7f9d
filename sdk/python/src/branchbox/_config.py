"""Where the service is and how to authenticate: arguments, then environment, then the
service's own files in the data directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DEFAULT_URL = "http://127.0.0.1:7420"
#: Time limit of control requests (create, fork, snapshot), seconds.
DEFAULT_REQUEST_TIMEOUT = 600.0


def _data_dir() -> Path:
    env = os.environ.get("BRANCHBOX_DATA")
    if env:
        return Path(env)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/branchbox")
    return Path.home() / ".local/share/branchbox"


def _read_first_line(p: Path) -> Optional[str]:
    try:
        line = p.read_text().strip().splitlines()
    except OSError:
        return None
    return line[0].strip() if line else None


@dataclass(frozen=True)
class ConnectionConfig:
    """Connection settings of a client."""

    api_url: str
    token: Optional[str]
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    @staticmethod
    def resolve(
        api_url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "ConnectionConfig":
        """Settings from the arguments, `BRANCHBOX_URL`/`BRANCHBOX_TOKEN`, or the data directory."""
        service = _data_dir() / "service"
        url = api_url or os.environ.get("BRANCHBOX_URL") or _read_first_line(service / "url") or DEFAULT_URL
        tok = token or os.environ.get("BRANCHBOX_TOKEN") or _read_first_line(service / "token")
        return ConnectionConfig(
            api_url=url.rstrip("/"),
            token=tok,
            request_timeout=request_timeout if request_timeout is not None else DEFAULT_REQUEST_TIMEOUT,
        )

    def headers(self) -> dict:
        """Headers every request carries."""
        h = {"user-agent": "branchbox-python/0.1.0"}
        if self.token:
            h["authorization"] = f"Bearer {self.token}"
        return h
