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


# Bidirectional overrides and line separators reorder or break what a reader sees.
INVISIBLE_CONTROLS = frozenset(
    (0x2028, 0x2029, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E)
)


def safe_text(value: str, limit: int = 1024, *, escape_backslash: bool = True) -> str:
    """Escape control characters, backslashes and undecodable bytes; cut to `limit`.

    The result is printable, single-line and valid UTF-8, fit for a terminal, a JSON
    document, an Event note or a log line. With escape_backslash=False it is idempotent:
    text that was escaped once (by an agent) is not escaped again (by the handler)."""
    out = []
    for ch in value:
        code = ord(ch)
        if (
            code < 0x20
            or code == 0x7F
            or 0x80 <= code < 0xA0
            or 0xD800 <= code <= 0xDFFF
            or code in INVISIBLE_CONTROLS
        ):
            out.append(_escape(ch))
        elif ch == "\\" and escape_backslash:
            out.append("\\\\")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def c_string(raw: bytes) -> str:
    """A NUL-terminated kernel buffer as a str that round-trips through os.fsencode."""
    end = raw.find(b"\0")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")
