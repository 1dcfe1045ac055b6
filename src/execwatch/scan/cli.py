"""`execwatch scan`: predict exec failures in files, root filesystems and images.

Exit codes: 0 no finding at or above --fail-on, 1 findings, 2 bad input or a scan that
could not finish (any error inside it, a report that could not be written): 0 and 1 are
only ever said of a whole scan.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from execwatch import cliargs
from execwatch.scan import registry
from execwatch.scan.base import DEFAULT_AT, placed_images, scan_on_base
from execwatch.scan.errors import ScanInputError
from execwatch.scan.isolated import ProcessLimits, start_isolated
from execwatch.scan.model import ScanReport, Severity
from execwatch.scan.report import FORMATS, render
from execwatch.scan.runner import Progress as ScanProgress
from execwatch.scan.runner import ScanOptions, scan
from execwatch.text import safe_text

if TYPE_CHECKING:  # rich is imported for a terminal or a table only: a CI job's JSON report
    from rich.progress import Progress  # does not pay its start-up (a tenth of a scan)

EXIT_CLEAN, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "scan",
        help="predict exec failures in a binary, root filesystem or image before deploying",
        description="Check that every executable of a file, directory (root filesystem), OCI"
        " layout, docker-save/OCI tarball or rootfs tarball would start on its platform.",
    )
    p.add_argument(
        "target", help="file, directory, OCI layout, image archive or registry reference"
    )
    p.add_argument(
        "--platform",
        type=cliargs.platform,
        action="append",
        default=[],
        metavar="OS/ARCH[/VARIANT]",
        help="repeatable: for images, scan only these platforms of the index (default: all);"
        " check a file or root filesystem against each (default: this node's)",
    )
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here (default stdout)")
    p.add_argument(
        "--fail-on",
        choices=[s.label for s in Severity],
        default="error",
        help="exit 1 when a finding has at least this severity (default: error)",
    )
    p.add_argument(
        "--require-static",
        action="store_true",
        help="report every dynamically linked executable (static-pie is static)",
    )
    p.add_argument(
        "--cpu-level",
        type=cliargs.cpu_level,
        metavar="x86-64-vN",
        help="the x86-64 level of the nodes (v1..v4): an executable or library that needs"
        " more is an error (default: the amd64 platform's variant); with --run, amd64"
        " entrypoints run in a QEMU microVM whose CPU is that level (v1..v3)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="a target with nothing executable in it is a warning, not an error (exit 2)",
    )
    p.add_argument(
        "--max-memory",
        type=cliargs.size,
        default=ProcessLimits().memory,
        metavar="SIZE",
        help="address space the scan's own process may add (default 4G); past it the scan"
        " stops with exit 2",
    )
    p.add_argument(
        "--run",
        action="store_true",
        help="also start each platform's entrypoint in a sandbox (QEMU for a foreign one):"
        " its outcome joins the report as a finding with source: run",
    )
    p.add_argument(
        "--run-args",
        metavar="ARGS",
        help="--run: the arguments to try (e.g. --version) instead of Cmd",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="--run: wall-clock deadline per run; past it the sandbox is killed (default 10)",
    )
    p.add_argument(
        "--run-timeout-fails",
        action="store_true",
        help="--run: a program still running at the deadline is a failure (default: started)",
    )
    p.add_argument(
        "--qemu-dir",
        metavar="DIR",
        help="--run: where qemu-<arch>-static are, and qemu-system-x86_64 (default PATH)",
    )
    p.add_argument(
        "--vm-kernel",
        metavar="PATH",
        help="--run --cpu-level: the microVM's kernel (default /boot/vmlinuz-$(uname -r))",
    )
    p.add_argument(
        "--base",
        metavar="IMAGE|DIR|ARCHIVE",
        help="check the target's files as if placed at --at in this base image or root"
        " filesystem: its loader, libraries, PATH and #! interpreters",
    )
    p.add_argument(
        "--at",
        default=DEFAULT_AT,
        metavar="PATH",
        help=f"--base: where the files will be placed (default {DEFAULT_AT})",
    )
    p.add_argument(
        "--root",
        action="store_true",
        help="take a directory as a root filesystem even when it has no loader, /bin,"
        " /usr or /etc (default: such a directory's files are checked one by one)",
    )
    p.add_argument("--all", action="store_true", help="table: show every finding")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    registry.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = ScanOptions(
        platforms=tuple(dict.fromkeys(args.platform)),
        require_static=args.require_static,
        cpu_levels=args.cpu_level,
        allow_empty=args.allow_empty,
        root=args.root,
        registry=registry.options_from(args),
    )
    problem = output_problem(args.output) or _base_problem(args)
    if problem:
        _say(f"error: {problem}")
        return EXIT_BAD_INPUT
    try:
        report = _scan_and_run(args, options)
    except ScanInputError as exc:
        _say(f"error: {exc}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # RecursionError, MemoryError, a bug: never a finding's exit 1
        _say(f"error: the scan could not finish: {_describe(exc)}")
        return EXIT_BAD_INPUT
    for warning in report.warnings:
        _say(f"warning: {warning}")
    try:
        _write(report, args)
    except OSError as exc:
        _say(f"error: --output {args.output or '(stdout)'}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    except Exception as exc:
        _say(f"error: the report could not be written: {_describe(exc)}")
        return EXIT_BAD_INPUT
    worst = report.worst()
    return EXIT_FINDINGS if worst is not None and worst >= Severity.parse(args.fail_on) else 0


def _base_problem(args: argparse.Namespace) -> str | None:
    if args.base is not None and args.root:
        return "--root with --base: the target's files are placed at --at, not taken as a root"
    return None


def _scan_and_run(args: argparse.Namespace, options: ScanOptions) -> ScanReport:
    """The static scan in its own process; with --run, the runs meanwhile (each in a
    process of its own). An error of the static scan comes first: the run may have
    stumbled on the same bad input."""
    limits = ProcessLimits(memory=args.max_memory)
    static = start_isolated(lambda: _scan(args, options), limits, args.target)
    try:
        if not args.run:
            return static.result()
        try:
            return _run(args, options, static.result)
        except Exception:
            if static.status is None:
                static.result()
            raise
    finally:
        static.cancel()


def _scan(args: argparse.Namespace, options: ScanOptions) -> ScanReport:
    """The scan itself, in its own process (scan.isolated), with a progress bar on a
    terminal."""
    if args.base is not None:

        def go(progress: ScanProgress | None = None) -> ScanReport:
            return scan_on_base(args.target, args.base, args.at, options, progress)
    else:

        def go(progress: ScanProgress | None = None) -> ScanReport:
            return scan(args.target, options, progress)

    if args.no_progress or not sys.stderr.isatty():
        return go()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        return go(_progress(bar))


def _run(
    args: argparse.Namespace, options: ScanOptions, static: Callable[[], ScanReport]
) -> ScanReport:
    """--run: start every platform's entrypoint (execwatch.smoke) while the static scan
    runs; its report (`static()`) with the runs' findings."""
    import shlex

    from execwatch.smoke.namespaces import RunLimits
    from execwatch.smoke.runs import RunOptions, run_images, run_report

    run_options = RunOptions(
        args=None if args.run_args is None else tuple(shlex.split(args.run_args)),
        timeout_fails=args.run_timeout_fails,
        qemu_dir=args.qemu_dir,
        binfmt=os.environ.get("EXECWATCH_RUN_QEMU") != "direct",
        limits=RunLimits(deadline_s=args.run_timeout),
        cpu_levels=args.cpu_level,
        vm_kernel=args.vm_kernel,
    )
    if args.base is None:
        return run_report(
            args.target, static, options.platforms, run_options, options.registry, options.limits
        )
    with placed_images(args.target, args.base, args.at, options) as images:
        return run_images(images, static, options.platforms, run_options, options.limits)


def _say(message: str) -> None:
    """One line on stderr, whatever the message holds (paths and registry replies)."""
    line = safe_text(message, limit=4096, escape_backslash=False)
    sys.stderr.write(f"execwatch scan: {line}\n")
    sys.stderr.flush()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _progress(bar: Progress) -> Callable[[str, int | None], Callable[[int], None]]:
    def start(label: str, total: int | None) -> Callable[[int], None]:
        task = bar.add_task(label[-60:], total=total)
        return lambda n: bar.advance(task, n)

    return start


def _write(report: ScanReport, args: argparse.Namespace) -> None:
    if args.format == "table":
        from rich.console import Console

        from execwatch.scan.report.table import print_table

        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                print_table(report, Console(file=f, width=160), None if args.all else 50)
        else:
            if isinstance(sys.stdout, io.TextIOWrapper):  # a terminal that is not UTF-8
                sys.stdout.reconfigure(errors="backslashreplace")
            print_table(report, Console(), None if args.all else 50)
        return
    write_report(render(args.format, report), args.output)


def write_report(text: str, output: str | None) -> None:
    """To stdout, or next to `output` then renamed: a failed run never leaves half a report.

    UTF-8 whatever the locale, as JSON, SARIF and the JUnit declaration require."""
    if not output:
        sys.stdout.flush()
        binary: BinaryIO | None = getattr(sys.stdout, "buffer", None)
        if binary is None:  # a StringIO stands in for stdout
            sys.stdout.write(text)
            return
        binary.write(text.encode("utf-8"))
        binary.flush()
        return
    if os.path.exists(output) and not os.path.isfile(output):
        # /dev/null, a FIFO, /dev/stdout: a rename would put a regular file in its place.
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        return
    directory = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".execwatch-report-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise


def output_problem(output: str | None) -> str | None:
    """Why a report could not be written to `output`: asked before a scan that may take
    minutes, not after it."""
    if not output:
        return None
    if os.path.isdir(output):
        return f"--output {output}: is a directory"
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        return f"--output {output}: no directory {directory}"
    if not os.path.exists(output) and not os.access(directory, os.W_OK):
        return f"--output {output}: cannot write in {directory}"
    return None
