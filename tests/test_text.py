"""Untrusted strings are escaped before anyone sees them."""

from __future__ import annotations

import logging
import os

import pytest

from execwatch.binfmt import Platform
from execwatch.cluster.safe import is_label_value
from execwatch.logs import KeyValueFormatter
from execwatch.text import c_string, safe_text


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
