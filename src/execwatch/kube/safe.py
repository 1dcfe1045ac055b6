"""Untrusted strings made safe for Events, labels, metric labels and logs.

Paths and comms come from whatever process failed to exec: they may carry newlines,
terminal escapes, undecodable bytes (kept as surrogate escapes) or be 4 KiB long.
Everything that leaves the agent or reaches a person goes through `execwatch.text.safe_text`,
which is lossless for ordinary text and escapes the rest visibly instead of dropping it;
this module adds what the API server's formats need on top.
"""

from __future__ import annotations

import re

from execwatch.text import safe_text

# Matched with fullmatch: `$` alone would accept a trailing newline ("x\n").
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


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
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def metric_label(value: str | None, limit: int = 128) -> str:
    """A Prometheus label value: escaped, bounded, never empty-vs-missing ambiguous."""
    if not value:
        return ""
    return safe_text(value, limit)
