"""Untrusted strings are escaped before anyone sees them."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from urllib.parse import unquote_to_bytes
from xml.sax.saxutils import escape, quoteattr

import pytest
from rich.console import Console

from execwatch.binfmt import Platform
from execwatch.kube.safe import is_label_value
from execwatch.logs import KeyValueFormatter
from execwatch.node.output import human_line, json_line
from execwatch.record import Diagnosis, ExecFailed, ExecFailure, Reason
from execwatch.text import (
    REPORT_LIMIT,
    c_string,
    safe_name,
    safe_prose,
    safe_text,
    terminal_text,
    uri_path,
)


def test_control_characters_and_escapes_are_escaped() -> None:
    assert safe_text("a\nb\x1b[31mc\r") == "a\\x0ab\\x1b[31mc\\x0d"


def test_undecodable_bytes_show_as_hex_and_backslashes_stay_unambiguous() -> None:
    name = os.fsdecode(b"bin\xff\\x")
    assert safe_text(name) == "bin\\xff\\\\x"


def test_long_values_are_cut() -> None:
    assert safe_text("x" * 5000, limit=10) == "x" * 9 + "…"


def test_kernel_strings_stop_at_nul_and_round_trip_to_bytes() -> None:
    text = c_string(b"/tmp/\xfe\xff\0garbage")
    assert os.fsencode(text) == b"/tmp/\xfe\xff"


def test_bidi_overrides_cannot_disguise_a_name() -> None:
    assert safe_text("evil\u202etxt.exe") == "evil\\u202etxt.exe"


def test_escaping_twice_without_backslash_escapes_is_idempotent() -> None:
    once = safe_text("a\nb\\c")
    assert safe_text(once, escape_backslash=False) == once


def test_log_lines_carry_every_extra_field_escaped() -> None:
    record = logging.LogRecord("execwatch.t", logging.INFO, "", 0, "seen %s", ("x",), None)
    record.kv = {"path": "/tmp/a b\n"}
    record.container_id = "abc"
    line = KeyValueFormatter().format(record)
    assert line.endswith('msg="seen x" path="/tmp/a b\\x0a" container_id=abc')
    assert "\n" not in line


@pytest.mark.parametrize(
    ("char", "escaped"),
    [
        ("\u202a", "\\u202a"), ("\u202e", "\\u202e"),  # embeddings and overrides
        ("\u2066", "\\u2066"), ("\u2067", "\\u2067"), ("\u2068", "\\u2068"), ("\u2069", "\\u2069"),
        ("\u061c", "\\u061c"), ("\u200e", "\\u200e"), ("\u200f", "\\u200f"),  # marks
        ("\u200b", "\\u200b"), ("\u200c", "\\u200c"), ("\u200d", "\\u200d"), ("\u2060", "\\u2060"),
        ("\ufeff", "\\ufeff"), ("\u00ad", "\\xad"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
        ("\U000e0041", "\\U000e0041"),  # a tag character: invisible "A"
        ("\u00a0", "\\xa0"), ("\ue000", "\\ue000"),  # no-break space, private use
    ],
)  # fmt: skip
def test_invisible_and_reordering_characters_are_escaped(char: str, escaped: str) -> None:
    assert safe_text(f"pod{char}name") == f"pod{escaped}name"


def test_visible_text_of_any_script_is_kept() -> None:
    for text in ("café", "путь/к/файлу", "二進位檔", "مسار", "a b", "emoji 🚀"):
        assert safe_text(text) == text


def test_escaped_text_is_printable_and_stable() -> None:
    hostile = "a\u2066b\u200d\ufeff\\c\U000e0041\udcff"
    once = safe_text(hostile)
    assert once.isprintable() and once.isascii()
    assert safe_text(once, escape_backslash=False) == once


@pytest.mark.parametrize("value", ["x\n", "x\r\n", "\nx", "a\nb", "x\u200b", " x", "x" * 64])
def test_label_values_are_validated_whole(value: str) -> None:
    assert not is_label_value(value)


@pytest.mark.parametrize("value", ["", "x", "ExecFormatError", "a-b_c.d", "x" * 63])
def test_valid_label_values(value: str) -> None:
    assert is_label_value(value)


@pytest.mark.parametrize("text", ["linux\n/amd64", "amd64\n/v8", "linux/amd64\n/v8"])
def test_platform_names_are_validated_whole(text: str) -> None:
    with pytest.raises(ValueError, match="invalid platform"):
        Platform.parse(text)


# Reports (scan, audit): one escaping for every format, then the medium's own quoting.

XML_FORBIDDEN = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def every_character() -> Iterator[str]:
    """All of Unicode, surrogates included, as os.fsdecode gives them, in chunks."""
    for start in range(0, 0x110000, 0x8000):
        yield "".join(map(chr, range(start, min(start + 0x8000, 0x110000))))


def test_escaped_text_of_any_character_is_valid_xml_and_utf8_on_one_line() -> None:
    for chunk in every_character():
        shown = safe_text(chunk, limit=1 << 20)
        assert not XML_FORBIDDEN.search(shown)
        assert "\n" not in shown and "\r" not in shown and "\t" not in shown
        shown.encode("utf-8")  # strict: no surrogate left
        ET.fromstring(f"<a b={quoteattr(shown)}>{escape(shown)}</a>".encode())


def test_a_name_in_a_report_reads_as_trace_prints_it_and_is_reversible() -> None:
    raw = b"/bin/a\x1b[1m\xff\\x\n"
    assert (
        safe_name(os.fsdecode(raw))
        == safe_text(os.fsdecode(raw))
        == "/bin/a\\x1b[1m\\xff\\\\x\\x0a"
    )


def test_a_report_keeps_whole_paths_up_to_path_max() -> None:
    path = "/" + "d/" * 2000 + "f"
    assert safe_name(path) == path and len(path) > 1024
    assert len(safe_name(path * 2)) == REPORT_LIMIT


def test_prose_keeps_the_backslashes_its_author_wrote() -> None:
    message = "the kernel looks for '/bin/sh\\r'\x1b[2J"
    assert safe_prose(message) == "the kernel looks for '/bin/sh\\r'\\x1b[2J"


def test_terminal_text_is_never_markup_nor_an_emoji_code() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", width=200)
    console.print(terminal_text("[bold red]fake[/] :thumbs_up: \x1b[31m", "green"))
    assert out.getvalue() == "\x1b[32m[bold red]fake[/] :thumbs_up: \\x1b[31m\x1b[0m\n"


@pytest.mark.parametrize(
    ("path", "uri"),
    [
        ("/usr/lib/libstdc++.so.6", "usr/lib/libstdc++.so.6"),
        ("/bin/[bold] x", "bin/%5Bbold%5D%20x"),
        (os.fsdecode(b"/bin/bad\xff"), "bin/bad%FF"),
        ("/bin/caf\u00e9?#%", "bin/caf%C3%A9%3F%23%25"),
        ("/a:b", "a%3Ab"),  # a first segment with ":" would read as a scheme
        ("/", "/"),
        ("relative", "relative"),
    ],
)
def test_uri_paths_percent_encode_the_exact_bytes(path: str, uri: str) -> None:
    assert uri_path(path) == uri
    assert os.fsdecode(unquote_to_bytes(uri)) == (path.lstrip("/") or path)


def test_trace_prints_a_name_as_every_report_shows_it() -> None:
    path = os.fsdecode(b"/bin/[bold]a\x1b[1m\xff\\x")
    event = ExecFailed(
        time=0.0, errno=8, pid=2, tgid=2, ppid=1, uid=0, comm="sh", parent_comm="init",
        path=path, cgroup_id=1, mntns=1, syscall="execve",
    )  # fmt: skip
    failure = ExecFailure(event, Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64"))
    shown = "/bin/[bold]a\\x1b[1m\\xff\\\\x"
    assert safe_name(path) == shown
    assert f" {shown} " in human_line(failure)
    assert json.loads(json_line(failure))["path"] == shown
