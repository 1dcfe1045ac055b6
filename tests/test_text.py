"""Untrusted strings are escaped before anyone sees them."""

from __future__ import annotations

import logging
import os

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
