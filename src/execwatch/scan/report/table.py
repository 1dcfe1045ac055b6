"""The human view: a rich table per image, entrypoint first, and a one-line summary."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from execwatch.scan.model import ScanReport, Severity

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.NOTE: "cyan"}


def print_table(report: ScanReport, console: Console, limit: int | None = 50) -> None:
    for result in report.results:
        s = result.stats
        console.print(
            f"[bold]{escape(result.source)}[/bold] {escape('[' + result.platform + ']')}:"
            f" {s.files} files,"
            f" {s.executables} executables ({s.elf} ELF, {s.scripts} scripts)"
            + (f" {escape(result.digest)}" if result.digest else "")
        )
        if result.entrypoint:
            console.print(f"  entrypoint: {escape(' '.join(result.entrypoint))}")
        for note in result.notes:
            console.print(f"  note: {escape(note)}")
        if not result.findings:
            console.print("  [green]no findings[/green]")
            continue
        table = Table(show_lines=False, pad_edge=False)
        for column in ("severity", "check", "path", "message"):
            table.add_column(column, overflow="fold")
        shown = result.findings if limit is None else result.findings[:limit]
        for f in shown:
            path = f"★ {f.path}" if f.entrypoint else f.path
            table.add_row(
                f"[{STYLE[f.severity]}]{f.severity.label}[/]", str(f.check), path, f.message
            )
        console.print(table)
        hidden = len(result.findings) - len(shown)
        if hidden > 0:
            console.print(f"  … {hidden} more (use --all or --format json)")
    counts = Counter(f.severity.label for f in report.findings)
    summary = ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "no findings"
    console.print(f"[bold]summary:[/bold] {summary} (★ = entrypoint)")
