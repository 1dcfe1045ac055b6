"""The human view: a rich table per image, entrypoint first, and a one-line summary.

Every string from the input reaches rich as a Text (text.terminal_text): escaped, and
never read as markup or emoji codes.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from execwatch.scan.model import ImageResult, ScanReport, Severity
from execwatch.text import terminal_text

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.NOTE: "cyan"}


def _heading(result: ImageResult) -> Text:
    s = result.stats
    line = Text.assemble(
        terminal_text(result.source, "bold"),
        " [",
        terminal_text(result.platform),
        f"]: {s.files} files, {s.executables} executables ({s.elf} ELF, {s.scripts} scripts)",
    )
    if result.digest:
        line.append_text(Text(" ").append_text(terminal_text(result.digest)))
    return line


def print_table(report: ScanReport, console: Console, limit: int | None = 50) -> None:
    for result in report.results:
        console.print(_heading(result))
        if result.entrypoint:
            words = Text(" ").join(terminal_text(word) for word in result.entrypoint)
            console.print(Text("  entrypoint: ").append_text(words))
        for note in result.notes:
            console.print(Text("  note: ").append_text(terminal_text(note, prose=True)))
        if not result.findings:
            console.print(Text("  no findings", "green"))
            continue
        table = Table(show_lines=False, pad_edge=False)
        for column in ("severity", "check", "path", "message"):
            table.add_column(column, overflow="fold")
        shown = result.findings if limit is None else result.findings[:limit]
        for f in shown:
            path = terminal_text(f.path)
            table.add_row(
                Text(f.severity.label, STYLE[f.severity]),
                Text(str(f.check)),
                Text("★ ").append_text(path) if f.entrypoint else path,
                terminal_text(f.message, prose=True),
            )
        console.print(table)
        hidden = len(result.findings) - len(shown)
        if hidden > 0:
            console.print(Text(f"  … {hidden} more (use --all or --format json)"))
    counts = Counter(f.severity.label for f in report.findings)
    summary = ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "no findings"
    console.print(Text.assemble(("summary:", "bold"), f" {summary} (★ = entrypoint)"))
