"""Where the service is and how to authenticate: arguments, then environment, then the
service's own files in the data directory. A token read from those files is only sent to a
service that first proves it holds it (docs/security.md, "The service's proof")."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import httpx

from .exceptions import AuthenticationError

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


def proof(token: str, listen: str, nonce: str) -> str:
    """What a service holding `token` answers to `nonce` at address `listen`: hex
    HMAC-SHA256 keyed with SHA-256(token) (the service keeps only that hash)."""
    key = hashlib.sha256(token.encode()).digest()
    return hmac.new(key, f"branchbox-service-proof\n{listen}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def verify_service(url: str, token: str, expect_listen: Optional[str]) -> None:
    """Raises `AuthenticationError` unless the process at `url` proves it holds `token`
    (and, with `expect_listen`, that it listens there): after branchboxd dies, its URL file
    stays, and whoever takes the port next must not receive the token."""
    nonce = secrets.token_hex(32)
    why = None
    try:
        answer = httpx.get(f"{url}/v1/auth/challenge", params={"nonce": nonce}, timeout=5).json()
    except (httpx.HTTPError, ValueError) as e:
        answer, why = None, f"the challenge failed ({e})"
    if why is None:
        listen = answer.get("listen") if isinstance(answer, dict) else None
        proofs = answer.get("proofs") if isinstance(answer, dict) else None
        if not isinstance(listen, str) or not isinstance(proofs, list):
            why = "its answer to the challenge is not the service's"
        elif expect_listen is not None and listen != expect_listen:
            why = f"it proved itself for {listen!r}, not {expect_listen!r}"
        else:
            want = proof(token, listen, nonce)
            if not any(isinstance(p, str) and hmac.compare_digest(p, want) for p in proofs):
                why = "its answer does not match the token"
    if why is not None:
        raise AuthenticationError(
            f"the process answering at {url} did not prove it is the branchbox service, so the token was "
            f"not sent to it: {why}; if branchboxd is not running, remove its url file",
            code="unverified_service",
        )


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
        """Settings from the arguments, `BRANCHBOX_URL`/`BRANCHBOX_TOKEN`, the data directory,
        or (the token only) `E2B_API_KEY`."""
        service = _data_dir() / "service"
        named_url = api_url or os.environ.get("BRANCHBOX_URL")
        file_url = None if named_url else _read_first_line(service / "url")
        url = (named_url or file_url or DEFAULT_URL).rstrip("/")
        tok = token or os.environ.get("BRANCHBOX_TOKEN")
        if not tok:
            tok = _read_first_line(service / "token")
            if tok:
                # A URL from the service's own file is its listen address; a named one may
                # pass a proxy or tunnel that listens elsewhere.
                expect = file_url.rstrip("/").removeprefix("http://") if file_url else None
                verify_service(url, tok, expect)
        if not tok:
            # E2B's variable, last: a key meant for E2B's cloud is not sent to a service whose
            # own token is at hand.
            tok = os.environ.get("E2B_API_KEY") or None
        return ConnectionConfig(
            api_url=url,
            token=tok,
            request_timeout=request_timeout if request_timeout is not None else DEFAULT_REQUEST_TIMEOUT,
        )

    def headers(self) -> dict:
        """Headers every request carries."""
        h = {"user-agent": "branchbox-python/0.1.0"}
        if self.token:
            h["authorization"] = f"Bearer {self.token}"
        return h
