"""The docs describe the present: no commit-pinned baseline, no path of one machine, no
before/after table, no notebook phrases, and at most one table of figures per doc. Their
links, and the docs the code names, exist."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

# A commit named as a baseline: `git show 1a2b3c4`, `git show 1a2b3c4:src/x.py`,
# "commit 1a2b3c4", or a bare hash in backquotes.
COMMIT = re.compile(
    r"(?:\bgit show\s+|\bcommits?\s+`?)([0-9a-f]{7,40})\b|`([0-9a-f]{7,40})(?::[^`]*)?`",
    re.IGNORECASE,
)
# A directory of the machine the figures were taken on; /proc/1/root/ is not one.
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root)/")
# /tmp/ in prose; inside a code block or inline code it is part of a command.
TMP_PATH = re.compile(r"(?<![\w.~/-])/tmp/")
# Phrases of a notebook, not of a description.
NOTEBOOK = ("we compared", "a later run", "timed out once", "first implementation")
# A header cell that names a measurement makes a table a table of figures.
FIGURE_CELL = re.compile(
    r"figures?|value|p50|p99|ms|µs|ns|wall( s)?|cpu( s)?|mb|kib|peak.*|.*\brss\b.*|"
    r"before|after|now|baseline.*|measured|records/s",
    re.IGNORECASE,
)
BEFORE_AFTER = ({"before"}, {"now", "after"})
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_MENTION = re.compile(r"\bdocs/[\w/.-]+\.md\b")
MENTIONING = ("src", "tests", "dev", "charts", "deploy", "benchmarks")
ROOT_FILES = ("pyproject.toml", "Makefile", "Containerfile")


def without_code(text: str) -> str:
    """The prose of a markdown text: fenced blocks and inline code blanked."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "``", text)


def table_headers(text: str) -> list[list[str]]:
    """The header cells of each markdown table (a row followed by a |---| row)."""
    lines = without_code_blocks(text).splitlines()
    headers = []
    for row, rule in itertools.pairwise(lines):
        if row.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+\s*", rule):
            headers.append([c.strip() for c in row.strip().strip("|").split("|")])
    return headers


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def is_figures(header: list[str]) -> bool:
    return any(FIGURE_CELL.fullmatch(cell) for cell in header)


def is_before_after(header: list[str]) -> bool:
    cells = {c.lower() for c in header}
    return all(cells & side for side in BEFORE_AFTER)


def findings(text: str) -> list[str]:
    """What keeps a doc from describing the present, one line each."""
    found = [f"commit baseline {m.group(0)!r}" for m in COMMIT.finditer(text)]
    found += [f"machine path in {line.strip()!r}" for line in text.splitlines()
              if MACHINE_PATH.search(line)]  # fmt: skip
    prose = without_code(text)
    found += [f"/tmp/ in prose: {line.strip()!r}" for line in prose.splitlines()
              if TMP_PATH.search(line)]  # fmt: skip
    found += [f"notebook phrase {p!r}" for p in NOTEBOOK if p in prose.lower()]
    headers = table_headers(text)
    found += [f"before/after table {h}" for h in headers if is_before_after(h)]
    figures = [h for h in headers if is_figures(h)]
    if len(figures) > 1:
        found.append(f"{len(figures)} tables of figures: {figures}")
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = without_code_blocks(doc.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.MULTILINE)}


def broken_links(doc: Path) -> list[str]:
    """Relative links of a doc to a file that is not there, or to a heading it lacks."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        path, _, fragment = target.partition("#")
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        linked = (doc.parent / path).resolve() if path else doc
        heading = not fragment or linked.suffix != ".md" or fragment in anchors(linked)
        if not (linked.exists() and heading):
            broken.append(target)
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_the_doc_describes_the_present(doc: Path) -> None:
    assert findings(doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_every_relative_link_of_the_doc_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_every_doc_the_code_names_exists() -> None:
    """Comments, docstrings, chart values and scripts (as git tracks them) name docs that
    are there."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *ROOT_FILES, *MENTIONING],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    files = [REPO / name for name in listed.split("\0") if name and (REPO / name).is_file()]
    named = {
        (str(path.relative_to(REPO)), mention)
        for path in files
        if path.suffix in (".py", ".sh", ".yaml", ".txt", ".tpl", ".h", ".c", ".toml", "")
        for mention in DOC_MENTION.findall(path.read_text(errors="replace"))
    }
    assert named, "no file names a doc: the pattern is wrong"
    assert sorted((f, m) for f, m in named if not (REPO / m).exists()) == []


def test_a_commit_pinned_baseline_is_found() -> None:
    assert len(findings("old reader: `git show aa0f60b:src/x.py`")) == 1
    assert len(findings("the agent of commit 5beb364 used more")) == 1
    assert len(findings("the official-client agent of `5beb364d`")) == 1
    assert findings("the layer `sha256:" + "ab12" * 16 + "`, 1024 bytes") == []
    assert findings("commit the spool within 0.2 s") == []


def test_a_machine_path_is_found_but_not_a_host_root() -> None:
    assert len(findings("`git clone /work/main c`")) == 1
    assert len(findings("see /root/.cache/x")) == 1
    assert len(findings("files land in /tmp/bench")) == 1
    assert findings("`--host-root /proc/1/root`, then /proc/PARENT/root/") == []
    assert findings("```sh\nexecwatch scan /tmp/rootfs\n```\n") == []


def test_one_table_of_figures_per_doc() -> None:
    figures = "| figure | value | command |\n|---|---|---|\n| a | 1 s | `x` |\n"
    other = "| flag | default |\n|---|---|\n| `--rate` | 20 |\n"
    assert findings(figures + "\n" + other) == []
    assert len(findings(figures + "\n" + figures)) == 1
    timings = "| tool | wall s | CPU s |\n|---|--:|--:|\n| a | 1 | 1 |\n"
    assert len(findings(timings + "\n" + figures)) == 1


def test_a_before_after_table_is_found() -> None:
    assert len(findings("| input | before | now |\n|---|---:|---:|\n| a | 8 s | 1 ms |\n")) == 1
    assert findings("a later run, load average 15") == ["notebook phrase 'a later run'"]
