"""Structured logging: one `key=value` line per record, values escaped.

Call sites pass context as `extra={"kv": {...}}` or as plain `extra` keys; both become
fields, so operators can grep and parse logs without a logging framework.
"""

from __future__ import annotations

import logging
import sys

from execwatch.text import safe_text

# Attributes every LogRecord has: anything else on a record came from `extra`.
STANDARD_ATTRIBUTES = frozenset(
    [*vars(logging.LogRecord("", 0, "", 0, "", (), None)), "message", "asctime", "kv"]
)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(getattr(record, "kv", {}))
        fields.update((k, v) for k, v in vars(record).items() if k not in STANDARD_ATTRIBUTES)
        if record.exc_info:
            fields["error"] = repr(record.exc_info[1])
        return " ".join(f"{k}={quote(str(v))}" for k, v in fields.items())


def quote(value: str) -> str:
    text = safe_text(value, limit=4096)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
