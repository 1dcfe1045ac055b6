"""`#!` lines as Linux's binfmt_script (fs/binfmt_script.c, 5.1 and later) reads them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from execwatch.binfmt.elf import ELF_MAGIC

BINPRM_BUF_SIZE = 256
_SPACETAB = b" \t"
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
CAUSE_HEAD_BYTES = 32  # the first bytes a cause shows, escaped


@dataclass(frozen=True)
class Shebang:
    """The interpreter and optional single argument of a script, exactly as the kernel splits them.

    `crlf` is True when the line ends in a carriage return: the kernel keeps the CR, so the
    interpreter it looks for is literally "/bin/sh\\r" (or the argument ends in "\\r").
    """

    interpreter: str
    argument: str | None
    crlf: bool


def sniff(head: bytes) -> Literal["elf", "shebang", "other"]:
    """Which binfmt handler would claim a file starting with `head`."""
    if head.startswith(ELF_MAGIC):
        return "elf"
    if head.startswith(b"#!"):
        return "shebang"
    return "other"


def parse_shebang(head: bytes) -> Shebang | None:
    """Split the first line of a script; None where the kernel answers ENOEXEC.

    The kernel sees only the first 256 bytes (the rest of the buffer is NUL-filled). The
    interpreter runs to the first space, tab or NUL; everything after it, with surrounding
    spaces and tabs trimmed, is ONE argument. A line with no newline in the buffer is
    cut at 255 bytes unless the interpreter name itself would be cut, which is refused.
    """
    buf = head[:BINPRM_BUF_SIZE].ljust(BINPRM_BUF_SIZE, b"\0")
    if not buf.startswith(b"#!"):
        return None
    buf_end = BINPRM_BUF_SIZE - 1
    i_end = buf.find(b"\n")
    if i_end < 0:
        start = _next_non_spacetab(buf, 2, buf_end + 1)
        if start is None or _next_terminator(buf, start, buf_end + 1) is None:
            return None
        i_end = buf_end
    while i_end > 2 and buf[i_end - 1] in _SPACETAB:
        i_end -= 1
    i_name = _next_non_spacetab(buf, 2, i_end)
    if i_name is None or i_name == i_end:
        return None
    i_sep = _next_terminator(buf, i_name, i_end)
    argument = None
    if i_sep is not None and buf[i_sep] != 0:
        i_arg = _next_non_spacetab(buf, i_sep, i_end)
        if i_arg is not None:
            argument = _c_string(buf[i_arg:i_end])
    interpreter = _c_string(buf[i_name : i_sep if i_sep is not None else i_end])
    crlf = buf[i_end - 1] == ord("\r")
    return Shebang(interpreter, argument, crlf)


def _next_non_spacetab(buf: bytes, start: int, end: int) -> int | None:
    for i in range(start, end):
        if buf[i] not in _SPACETAB:
            return i
    return None


def _next_terminator(buf: bytes, start: int, end: int) -> int | None:
    for i in range(start, end):
        if buf[i] in _SPACETAB or buf[i] == 0:
            return i
    return None


def _c_string(raw: bytes) -> str:
    return os.fsdecode(raw.split(b"\0", 1)[0])


def missing_shebang_cause(head: bytes) -> str:
    """Why a file the kernel refused (ENOEXEC, neither ELF nor `#!`) has no `#!` line, for
    a person: a UTF-8 byte order mark or a blank first line before `#!`, leading spaces,
    UTF-16, CRLF line endings, or no interpreter line at all; with its first bytes, escaped."""
    return f"{why_no_shebang(head)} (first bytes: {_escaped(head[:CAUSE_HEAD_BYTES])})"


def why_no_shebang(head: bytes) -> str:
    """The cause alone, for a medium that shows the bytes its own way (the node's details
    hold them raw, and each output escapes them)."""
    head = head[:BINPRM_BUF_SIZE]
    if not head:
        return "the file is empty"
    if head.startswith(b"#!"):  # parse_shebang refused it, as the kernel does
        return "a #! line that names no interpreter (empty, or too long for the kernel)"
    if head.startswith(UTF16_BOMS):
        return "the file is UTF-16 (byte order mark): the kernel reads #! as bytes"
    if head.startswith(UTF8_BOM):
        if head[len(UTF8_BOM) :].startswith(b"#!"):
            return "a UTF-8 byte order mark (EF BB BF) before #!: the kernel sees no #!"
        head = head[len(UTF8_BOM) :]
    stripped = head.lstrip(b" \t\r\n")
    if stripped.startswith(b"#!") and head[: len(head) - len(stripped)].strip(b" \t"):
        crlf = " (CRLF line endings)" if b"\r\n" in head else ""
        return f"a blank first line before #!{crlf}: #! must be the file's first two bytes"
    if stripped.startswith(b"#!"):
        return "spaces before #!: #! must be the file's first two bytes"
    if b"\r\n" in head and b"\n" not in head.replace(b"\r\n", b""):
        return "no #! interpreter line, and CRLF (Windows) line endings"
    return "no #! interpreter line"


def _escaped(data: bytes) -> str:
    """Bytes as a double-quoted Python-style literal: printable ASCII as is, the rest \\xNN."""
    out = []
    for byte in data:
        ch = chr(byte)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{byte:02x}"))
    return '"' + "".join(out) + '"'
