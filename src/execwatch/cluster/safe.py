"""Untrusted strings made safe for Events, labels, metric labels and logs.

Paths and comms come from whatever process failed to exec: they may carry newlines,
terminal escapes, undecodable bytes (kept as surrogate escapes) or be 4 KiB long.
Everything that leaves the agent or reaches a person goes through `safe_text`, which is
lossless for ordinary text and escapes the rest visibly instead of dropping it.
"""

from __future__ import annotations

import re

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def safe_text(value: str, limit: int = 1024, *, escape_backslash: bool = True) -> str:
    """Escape control characters, backslashes and undecodable bytes; cut to `limit`.

    The result is printable, single-line and valid UTF-8, so it can be put in JSON for
    the API server, in an Event note or in a log line without breaking its framing.
    With escape_backslash=False it is idempotent: the handler re-cleans what agents
    already escaped without doubling their backslashes.
    """
    out: list[str] = []
    for ch in value:
        code = ord(ch)
        if (
            code < 0x20
            or code == 0x7F
            or 0x80 <= code < 0xA0
            or 0xD800 <= code <= 0xDFFF
            or code in (0x2028, 0x2029, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E)
        ):
            out.append(_escape(ch))
        elif ch == "\\" and escape_backslash:
            out.append("\\\\")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def printable(value: str, limit: int = 1024) -> str:
    """What the handler applies to strings read back from the API server."""
    return safe_text(value, limit, escape_backslash=False)


def fit_bytes(text: str, limit: int) -> str:
    """Cut `text` so its UTF-8 encoding is at most `limit` bytes (the API server counts
    bytes, and an ellipsis is three of them)."""
    if len(text.encode()) <= limit:
        return text
    cut = text.encode()[: limit - 3].decode(errors="ignore")
    return cut + "…"


def is_label_value(value: str) -> bool:
    """True if `value` is a valid Kubernetes label value (63 chars, alnum ends)."""
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def metric_label(value: str | None, limit: int = 128) -> str:
    """A Prometheus label value: escaped, bounded, never empty-vs-missing ambiguous."""
    if not value:
        return ""
    return safe_text(value, limit)
