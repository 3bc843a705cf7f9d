"""The naming rule for snapshot names and refs, the same as the service's (and the CLI's):
checked here too, so a name like ``..`` or ``a/b`` is refused with a clear error before it
becomes part of a URL, where HTTP clients would resolve it as a path (docs/limits.md)."""

from __future__ import annotations

import re
import unicodedata

from .exceptions import InvalidArgumentError

#: Longest name, in bytes of UTF-8.
MAX_NAME_BYTES = 128

NAME_RULE = (
    "1-128 bytes of printable characters without spaces or '/', not starting with '-', "
    "not '.' or '..', and not shaped like an id (snap-/sbx- and 16 hex digits)"
)

_ID = re.compile(r"(snap|sbx)-[0-9a-f]{16}")
_SNAPSHOT_ID = re.compile(r"snap-[0-9a-f]{16}")


def _why(s: object) -> "str | None":
    if not isinstance(s, str):
        return "it is not a string"
    if not s:
        return "it is empty"
    size = len(s.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return f"it is {size} bytes long, over the limit of {MAX_NAME_BYTES}"
    if s in (".", ".."):
        return "'.' and '..' are path components"
    if s.startswith("-"):
        return "a leading '-' reads as a command-line option"
    for c in s:
        if c == "/" or unicodedata.category(c) == "Cc" or c.isspace():
            return f"it contains {c!r}"
    if _ID.fullmatch(s):
        return "it has the shape of an id, so lookups would be ambiguous"
    return None


def check_name(what: str, s: object) -> str:
    """Returns `s` when it is a valid name; raises `InvalidArgumentError` naming it otherwise."""
    why = _why(s)
    if why is not None:
        raise InvalidArgumentError(f"invalid {what} {s!r}: {why}; use {NAME_RULE}", code="invalid_name")
    return s  # type: ignore[return-value]


def check_snapshot_ref(s: object) -> str:
    """Returns `s` when it is a snapshot id or a valid name (or ref)."""
    if isinstance(s, str) and _SNAPSHOT_ID.fullmatch(s):
        return s
    if _why(s) is not None:
        raise InvalidArgumentError(
            f"{s!r} is neither a snapshot id (snap-<16 hex digits>) nor a valid name ({NAME_RULE})",
            code="invalid_id",
        )
    return s  # type: ignore[return-value]
