"""Making untrusted strings (paths, comms, pod names) safe to print, log and publish.

File names come from the failing process and may hold newlines, escape sequences or
bytes that are not UTF-8. Paths are carried as str with surrogate escapes
(os.fsdecode) so the exact bytes can still be opened; everything shown to a person
or another system goes through safe_text first.

Reports (`execwatch scan`/`audit`) use the same escaping through safe_name and safe_prose,
then the medium's own quoting: rich Text for a terminal (terminal_text, never markup),
ElementTree for XML, json for JSON and SARIF, percent-encoding for a URI (uri_path). A
name reads the same in every format and in `execwatch trace`: an undecodable byte is
\\xNN, a control character \\xNN, an invisible one \\uNNNN, a backslash \\\\.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:  # rich only where a terminal is written to: the node agent never loads it
    from rich.text import Text

# PATH_MAX: a report shows whole paths, where a trace line or an Event note cuts at 1024.
REPORT_LIMIT = 4096
# What RFC 3986 allows unquoted in a path besides unreserved characters; ":" is left out, as
# a relative reference whose first segment holds one would read as a scheme.
_URI_PATH_SAFE = "/!$&'()*+,;=@"


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code > 0xFFFF:
        return f"\\U{code:08x}"
    return f"\\u{code:04x}"


def _safe_char(ch: str, escape_backslash: bool) -> str:
    if ch == "\\":
        return "\\\\" if escape_backslash else ch
    return ch if ch.isprintable() else _escape(ch)


def safe_text(value: str, limit: int = 1024, *, escape_backslash: bool = True) -> str:
    """Escape what a reader cannot see, backslashes and undecodable bytes; cut to `limit`.

    Escaped is every character Python does not call printable: controls (C0, C1), format
    characters (bidi embeddings, overrides and isolates U+202A-202E, U+2066-2069, marks
    U+200E/200F/061C, zero-width U+200B-200D/U+2060, BOM U+FEFF, tag characters), line and
    paragraph separators, surrogates, private-use and unassigned code points, and spaces
    other than ASCII space. They reorder, hide or split what a person reads in a terminal,
    an Event note or a log line. The result is printable, single-line, valid UTF-8. With
    escape_backslash=False it is idempotent: text escaped once (by an agent) is not escaped
    again (by the handler)."""
    if value.isprintable() and not (escape_backslash and "\\" in value):
        text = value
    else:
        text = "".join(_safe_char(ch, escape_backslash) for ch in value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(message: str, limit: int = 300) -> str:
    """A message for a one-line error: every run of whitespace (newlines too) one space."""
    return safe_text(" ".join(message.split()), limit)


def c_string(raw: bytes) -> str:
    """A NUL-terminated kernel buffer as a str that round-trips through os.fsencode."""
    end = raw.find(b"\0")
    return (raw if end < 0 else raw[:end]).decode("utf-8", "surrogateescape")


def safe_name(value: str) -> str:
    """A name from the tenant (path, image, argv word) as a report shows it: safe_text,
    backslashes escaped, so the exact bytes can be read back from it."""
    return safe_text(value, REPORT_LIMIT)


def safe_prose(value: str) -> str:
    """A message that embeds names (some already quoted with repr by its author): safe_text
    without doubling the backslashes it holds."""
    return safe_text(value, REPORT_LIMIT, escape_backslash=False)


def terminal_text(value: str, style: str = "", *, prose: bool = False) -> Text:
    """Escaped text for rich that is never read as markup ([bold]) or emoji codes (:x:)."""
    from rich.text import Text

    return Text(safe_prose(value) if prose else safe_name(value), style=style)


def uri_path(path: str) -> str:
    """A file path as a relative URI reference (SARIF artifactLocation.uri): its exact bytes,
    percent-encoded where a URI forbids them (space, %, [, non-ASCII, controls ...)."""
    raw = path.lstrip("/") or path
    return quote(raw.encode("utf-8", "surrogateescape"), safe=_URI_PATH_SAFE)
