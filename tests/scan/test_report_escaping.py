"""Hostile file names through the real `execwatch scan`, in every format, to stdout, a
terminal and --output: each report stays valid for its medium and shows the name the way
`execwatch trace` does (text.safe_text), never as markup or terminal control."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import resource
import select
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

EXECWATCH = [sys.executable, "-m", "execwatch.cli", "scan", "--no-progress"]
PLATFORM = ("--platform", "linux/amd64")
MISSING = b"#!/missing/sh\n"
# name in the root's /bin -> how every report shows it
NAMES: dict[bytes, str] = {
    b"esc\x1b[31mred": "esc\\x1b[31mred",  # an ANSI colour sequence
    b"osc\x1b]0;owned\x07": "osc\\x1b]0;owned\\x07",  # sets the terminal's title
    b"c1\xc2\x9b2J": "c1\\x9b2J",  # the one-byte CSI (U+009B): clears a screen
    b"bad\xff\xfe": "bad\\xff\\xfe",  # not UTF-8
    b"back\\xff": "back\\\\xff",  # a real backslash: not the byte above
    b"ctl\x01\x0b\x7f": "ctl\\x01\\x0b\\x7f",  # forbidden in XML 1.0 (and DEL)
    b"nl\nline": "nl\\x0aline",
    "non\ufffechar".encode(): "non\\ufffechar",  # a noncharacter XML forbids too
    "bidi\u202eexe.sh".encode(): "bidi\\u202eexe.sh",  # reorders what is read
    b":thumbs_up:": ":thumbs_up:",  # a rich emoji code
    b"amp&<x>\"'": "amp&<x>\"'",  # XML's own specials
    "caf\u00e9-\u4e8c".encode(): "caf\u00e9-\u4e8c",  # visible: kept as it is
}
MARKUP = "/bin/[bold red]fake[/]"  # a directory "[bold red]fake[" holding "]"
HOSTILE_INTERPRETER = b"/opt/\x1b[2J[blink]sh"
FORMATS = ("table", "json", "sarif", "junit")
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # the styles rich itself writes to a terminal


def expected_paths() -> set[str]:
    return {"/bin/" + shown for shown in NAMES.values()} | {MARKUP, "/bin/interp"}


def build_root(where: Path) -> Path:
    """A real root filesystem whose executables all fail (no interpreter), named to hurt.
    The root's own name is not UTF-8 either: it is the report's source."""
    root = Path(os.fsdecode(os.fsencode(where) + b"/root\xff[red]"))
    bin_ = os.fsencode(root / "bin")
    os.makedirs(os.path.join(bin_, b"[bold red]fake["))
    for name in [*NAMES, b"[bold red]fake[/]"]:
        path = os.path.join(bin_, name)
        with open(path, "wb") as f:
            f.write(MISSING)
        os.chmod(path, 0o755)
    interp = os.path.join(bin_, b"interp")
    with open(interp, "wb") as f:
        f.write(b"#!" + HOSTILE_INTERPRETER + b"\n")
    os.chmod(interp, 0o755)
    return root


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_root(tmp_path_factory.mktemp("hostile"))


def scan(*argv: str | Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COLUMNS": "400", **env}  # COLUMNS: a table row per finding
    return subprocess.run(
        [*EXECWATCH, *PLATFORM, *map(str, argv)], capture_output=True, timeout=120, env=env
    )


def on_a_terminal(*argv: str | Path) -> tuple[int, bytes]:
    """Run with stdout on a pseudo-terminal, where rich writes styles: what a person sees."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    parent, child = pty.openpty()
    with subprocess.Popen(
        [*EXECWATCH, *PLATFORM, *map(str, argv)], stdout=child, stderr=subprocess.PIPE, env=env
    ) as proc:
        os.close(child)
        out = b""
        while True:
            ready, _, _ = select.select([parent], [], [], 120)
            assert ready, "no output from the scan in 120 s"
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=120)
    os.close(parent)
    return code, out


def strict_json(raw: bytes) -> Any:
    """Parsed as a strict consumer would: UTF-8, and no lone surrogate in any string."""
    doc = json.loads(raw.decode("utf-8"))
    for text in strings(doc):
        text.encode("utf-8")
    return doc


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*strings(k), *strings(v))]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return []


@pytest.fixture(scope="module")
def reports(
    tmp_path_factory: pytest.TempPathFactory, hostile_root: Path
) -> dict[str, list[tuple[str, bytes]]]:
    """Each format's report, on stdout and through --output; every run exits 1 in silence."""
    out = tmp_path_factory.mktemp("reports")
    found = {}
    for fmt in FORMATS:
        piped = scan(hostile_root, "--format", fmt)
        written = scan(hostile_root, "--format", fmt, "--output", out / fmt)
        for run in (piped, written):  # findings: 1, and not a traceback's 1
            assert (run.returncode, run.stderr) == (1, b""), run.stderr.decode(errors="replace")
        assert written.stdout == b""
        found[fmt] = [("stdout", piped.stdout), ("--output", (out / fmt).read_bytes())]
    return found


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_on_stdout_and_to_a_file_exits_1_and_is_plain_utf8_text(
    reports: dict[str, list[tuple[str, bytes]]], fmt: str
) -> None:
    for where, raw in reports[fmt]:
        text = raw.decode("utf-8")  # strict: not a single raw non-UTF-8 byte
        controls = {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}
        assert not controls, (where, controls)
        assert "\ufffe" not in text and "\u202e" not in text, where


def test_json_is_strict_and_names_read_as_trace_prints_them(
    reports: dict[str, list[tuple[str, bytes]]], hostile_root: Path
) -> None:
    for _, raw in reports["json"]:
        doc = strict_json(raw)
        assert {f["path"] for f in doc["findings"]} == expected_paths()
        (image,) = doc["images"]
        assert image["source"] == doc["target"] == str(hostile_root.parent) + "/root\\xff[red]"
        (interp,) = [f for f in doc["findings"] if f["path"] == "/bin/interp"]
        assert interp["message"] == "#! interpreter /opt/\\x1b[2J[blink]sh not found in the image"


def test_sarif_is_strict_json_and_locations_are_uris_of_the_exact_bytes(
    reports: dict[str, list[tuple[str, bytes]]], hostile_root: Path
) -> None:
    for _, raw in reports["sarif"]:
        doc = strict_json(raw)
        results = doc["runs"][0]["results"]
        uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
        assert "bin/bad%FF%FE" in uris and "bin/esc%1B%5B31mred" in uris
        assert "bin/%5Bbold%20red%5Dfake%5B/%5D" in uris
        assert all(re.fullmatch(r"[A-Za-z0-9\-._~!$&'()*+,;=@/%]+", u) for u in uris), uris
        texts = {r["message"]["text"] for r in results}
        assert "#! interpreter /opt/\\x1b[2J[blink]sh not found in the image [linux/amd64]" in texts
        assert {r["properties"]["image"]["source"] for r in results} == {
            str(hostile_root.parent) + "/root\\xff[red]"
        }


def test_junit_is_well_formed_xml_with_every_name_escaped(
    reports: dict[str, list[tuple[str, bytes]]], hostile_root: Path
) -> None:
    for where, raw in reports["junit"]:
        assert raw.startswith(b'<?xml version="1.0" encoding="UTF-8"?>'), where
        root = ET.fromstring(raw)  # bytes: expat checks the declared encoding too
        (suite,) = root.findall("testsuite")
        assert suite.get("name") == str(hostile_root.parent) + "/root\\xff[red] [linux/amd64]"
        failure = suite.find("testcase[@name='missing-shebang-interpreter']/failure")
        assert failure is not None and failure.text is not None
        lines = failure.text.splitlines()
        assert {line.split(": ")[1] for line in lines} == expected_paths(), where


def test_the_table_in_a_terminal_shows_names_literally_and_no_control_but_its_styles(
    hostile_root: Path,
) -> None:
    code, raw = on_a_terminal(hostile_root)
    assert code == 1
    assert SGR.search(raw), "rich wrote no style: not a terminal run"
    text = SGR.sub(b"", raw).replace(b"\r\n", b"\n").decode("utf-8")
    controls = {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0}
    assert not controls
    for path in expected_paths():
        assert path in text, path
    assert "/opt/\\x1b[2J[blink]sh" in text
    assert str(hostile_root.parent) + "/root\\xff[red]" in text


def test_the_table_on_a_pipe_and_in_a_file_shows_markup_and_emoji_codes_literally(
    reports: dict[str, list[tuple[str, bytes]]],
) -> None:
    for where, raw in reports["table"]:
        text = raw.decode("utf-8")
        assert MARKUP in text and "/bin/:thumbs_up:" in text, where
        assert "\U0001f44d" not in text, where
        assert "/bin/bad\\xff\\xfe" in text and "/bin/back\\\\xff" in text, where


def test_a_stdout_that_is_not_utf8_gets_the_table_escaped_and_the_junit_in_utf8(
    hostile_root: Path,
) -> None:
    table = scan(hostile_root, PYTHONIOENCODING="ascii")
    assert (table.returncode, table.stderr) == (1, b"")
    text = table.stdout.decode("ascii")
    assert MARKUP in text and "/bin/caf\\xe9-\\u4e8c" in text
    assert "summary: 14 error (\\u2605 = entrypoint)" in text
    junit = scan(hostile_root, "--format", "junit", PYTHONIOENCODING="latin-1")
    assert (junit.returncode, junit.stderr) == (1, b"")
    assert "/bin/caf\u00e9-\u4e8c" in ET.tostring(ET.fromstring(junit.stdout), "unicode")


# A scan that could not finish is never a verdict: exit 2, whatever stopped it.

MEMORY_LIMIT = 128 << 20  # address space: 3x what a small scan needs (under 40 MiB here)


def long_named_rootfs(path: Path, members: int) -> Path:
    """A rootfs tarball whose members have 400 KiB names (GNU long names): the tree keeps
    every path, so `members` sets the memory a scan needs (about 1 MiB each)."""
    with tarfile.open(path, "w:gz", compresslevel=1, format=tarfile.GNU_FORMAT) as tar:
        script = tarfile.TarInfo("bin/tool")
        script.size, script.mode = len(MISSING), 0o755
        tar.addfile(script, io.BytesIO(MISSING))
        for i in range(members):
            entry = tarfile.TarInfo(f"d/{i:04d}" + "x" * (400 << 10))
            entry.mode = 0o644
            tar.addfile(entry)
    return path


def scan_in_memory_limit(target: Path) -> subprocess.CompletedProcess[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [*EXECWATCH, *PLATFORM, "--format", "json", str(target)],
        capture_output=True,
        timeout=120,
        preexec_fn=limit,
    )


def test_a_scan_that_runs_out_of_memory_exits_2_with_one_line_and_no_report(
    tmp_path: Path,
) -> None:
    small = scan_in_memory_limit(long_named_rootfs(tmp_path / "small.tgz", 2))
    assert small.returncode == 1, small.stderr.decode(errors="replace")  # the limit lets it
    big = scan_in_memory_limit(long_named_rootfs(tmp_path / "big.tgz", 200))
    assert big.returncode == 2, big.stderr.decode(errors="replace")
    assert big.stdout == b""
    (line,) = big.stderr.decode().splitlines()
    assert line.startswith("execwatch scan: error: ")
