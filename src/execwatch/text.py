"""Making untrusted strings (paths, comms, pod names) safe to print, log and publish.

File names come from the failing process and may hold newlines, escape sequences or
bytes that are not UTF-8. Paths are carried as str with surrogate escapes
(os.fsdecode) so the exact bytes can still be opened; everything shown to a person
or another system goes through safe_text first.
"""

from __future__ import annotations


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def safe_text(value: str, limit: int = 1024) -> str:
    """Escape control characters and undecodable bytes; cut to limit characters."""
    out = []
    for ch in value:
        code = ord(ch)
        if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0 or 0xDC80 <= code <= 0xDCFF:
            out.append(_escape(ch))
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def c_string(raw: bytes) -> str:
    """A NUL-terminated kernel buffer as a str that round-trips through os.fsencode."""
    end = raw.find(b"\0")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")
