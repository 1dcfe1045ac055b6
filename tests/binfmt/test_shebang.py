"""parse_shebang and sniff follow fs/binfmt_script.c (Linux 5.1+), byte for byte."""

from __future__ import annotations

import pytest

from execwatch.binfmt import Shebang, parse_shebang, sniff


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"#!/bin/sh\n", Shebang("/bin/sh", None, crlf=False)),
        (b"#! /bin/sh\n", Shebang("/bin/sh", None, crlf=False)),
        (b"#!\t/bin/sh  \t\n", Shebang("/bin/sh", None, crlf=False)),
        (b"#!/usr/bin/env python3\n", Shebang("/usr/bin/env", "python3", crlf=False)),
        (b"#!/usr/bin/env -S a b  c\n", Shebang("/usr/bin/env", "-S a b  c", crlf=False)),
        (b"#!/bin/sh\r\n", Shebang("/bin/sh\r", None, crlf=True)),
        (b"#!/usr/bin/env bash\r\n", Shebang("/usr/bin/env", "bash\r", crlf=True)),
        (b"#!/bin/sh", Shebang("/bin/sh", None, crlf=False)),  # short file, no newline
        (b"#!/bin/sh\0junk\n", Shebang("/bin/sh", None, crlf=False)),  # NUL ends the name
        (b"#!/bin/bash -e\nexit 1\n", Shebang("/bin/bash", "-e", crlf=False)),
        # A 2-byte file: the NUL padding ends an empty name, so exec fails with ENOENT.
        (b"#!", Shebang("", None, crlf=False)),
    ],
)
def test_interpreter_ends_at_first_blank_and_the_rest_is_one_argument(
    head: bytes, expected: Shebang
) -> None:
    assert parse_shebang(head) == expected


@pytest.mark.parametrize(
    "head",
    [b"", b"#", b"#!\n", b"#!   \t \n", b"# !/bin/sh\n", b"\x7fELF", b"echo hi\n"],
)
def test_no_interpreter_is_not_a_script(head: bytes) -> None:
    assert parse_shebang(head) is None


def test_only_the_first_256_bytes_count() -> None:
    long_arg = b"#!/bin/sh " + b"a" * 400 + b"\n"
    parsed = parse_shebang(long_arg)
    assert parsed is not None and parsed.interpreter == "/bin/sh"
    assert parsed.argument == "a" * (255 - len(b"#!/bin/sh "))  # cut at 255 bytes


def test_an_interpreter_path_cut_by_the_buffer_is_refused() -> None:
    assert parse_shebang(b"#!/" + b"x" * 300 + b"\n") is None


def test_newline_past_256_bytes_is_not_seen() -> None:
    head = b"#!/bin/sh" + b" " * 300 + b"\n"
    assert parse_shebang(head) == Shebang("/bin/sh", None, crlf=False)


@pytest.mark.parametrize(
    ("head", "kind"),
    [(b"\x7fELF\x02\x01", "elf"), (b"#!/bin/sh", "shebang"), (b"\x7fEL", "other"), (b"", "other")],
)
def test_sniff(head: bytes, kind: str) -> None:
    assert sniff(head) == kind
