"""`execwatch audit`: which workloads of this cluster would fail on which architectures.

Exit codes as `execwatch scan`: 0 every workload ready wherever it can be scheduled,
1 some would fail, lack a platform or run emulated, 2 bad input (cluster or registry unreachable, an
image that could not be checked).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from execwatch import cliargs
from execwatch.audit.engine import AuditReport, ImageAuditor, Tick, audit
from execwatch.audit.inventory import Inventory
from execwatch.audit.node_emulation import Emulation, emulates
from execwatch.audit.report import print_table, to_json, to_sarif
from execwatch.kube.client import Rest
from execwatch.runnable.limits import Limits
from execwatch.runnable.verdict import Outcome
from execwatch.scan import registry
from execwatch.scan.cli import output_problem, write_report
from execwatch.scan.errors import ScanInputError
from execwatch.text import one_line

EXIT_CLEAN, EXIT_FAILING, EXIT_BAD_INPUT = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "audit",
        help="which workloads of a cluster would fail on which node architectures",
        description="List the cluster's workloads and scan each image for every architecture"
        " its pods could be scheduled to (read-only).",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config,"
                   " then in-cluster)")  # fmt: skip
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--namespace", "-n", help="only this namespace (default: all)")
    p.add_argument(
        "--arch",
        type=cliargs.architecture,
        action="append",
        default=[],
        metavar="ARCH",
        help="also check this architecture, e.g. for nodes about to be added (arm64)",
    )
    p.add_argument(
        "--emulates",
        type=emulates,
        action="append",
        default=[],
        metavar="[NODE_ARCH=]ARCH[,ARCH]",
        help="the nodes (of NODE_ARCH, else all) run ARCH's binaries through a binfmt_misc"
        " emulator (execwatch_node_binfmt_emulators): such binaries are 'emulated', not failing",
    )
    p.add_argument("--format", choices=["table", "json", "sarif"], default="table")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here (default stdout)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    registry.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from execwatch.audit.inventory import read_cluster
    from execwatch.kube.errors import ApiError

    err = Console(stderr=True)
    problem = output_problem(args.output)
    if problem:
        return _refused(err, problem)
    try:
        rest = _rest(args)
    except Exception as exc:  # lightkube's ConfigError, a YAML error, a kubeconfig's shape
        return _refused(err, f"cluster: {exc}")
    try:
        with rest:
            inventory = read_cluster(rest, args.namespace)
    except (ApiError, OSError) as exc:  # OSError: a token or CA file that went away
        return _refused(err, f"cluster: {getattr(exc, 'reason', None) or exc}")
    try:  # each image's failure is its own UNKNOWN verdict: this is for the rest of the run
        report = _audit(inventory, args, err)
    except ScanInputError as exc:
        return _refused(err, str(exc))
    except Exception as exc:
        return _refused(err, f"the audit could not finish: {_describe(exc)}")
    try:
        _write(report, args)
    except OSError as exc:
        return _refused(err, f"--output {args.output or '(stdout)'}: {exc.strerror or exc}")
    except Exception as exc:
        return _refused(err, f"the report could not be written: {_describe(exc)}")
    worst = report.worst()
    if worst is Outcome.UNKNOWN:
        return EXIT_BAD_INPUT
    return EXIT_FAILING if worst is not None and worst is not Outcome.RUNS else EXIT_CLEAN


def _audit(inventory: Inventory, args: argparse.Namespace, err: Console) -> AuditReport:
    auditor = ImageAuditor(registry.options_from(args), Limits(), args.cache_dir)
    emulation = Emulation.of_options(args.emulates)
    if not args.no_progress and err.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True) as bar:  # fmt: skip
            return audit(inventory, args.arch, auditor, _progress(bar), emulation)
    return audit(inventory, args.arch, auditor, emulation=emulation)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _refused(err: Console, message: str) -> int:
    err.print(
        f"execwatch audit: error: {one_line(message)}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_BAD_INPUT


def _rest(args: argparse.Namespace) -> Rest:
    """The kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) at --context, else the
    in-cluster ServiceAccount."""
    from lightkube import KubeConfig

    path = args.kubeconfig or os.environ.get("KUBECONFIG")
    default = os.path.expanduser("~/.kube/config")
    if path or os.path.exists(default):
        return Rest(KubeConfig.from_file(path or default), context=args.context)
    return Rest(KubeConfig.from_service_account())


def _progress(bar: Progress) -> Callable[[int], Tick]:
    def start(total: int) -> Tick:
        task = bar.add_task("scanning images", total=total)
        return lambda label: bar.update(task, advance=1, description=label[-50:])

    return start


def _write(report: AuditReport, args: argparse.Namespace) -> None:
    if args.format == "table":
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                print_table(report, Console(file=f, width=200))
        else:  # a pipe or a CI log gets the whole table, not 80 columns
            print_table(report, Console() if sys.stdout.isatty() else Console(width=200))
        return
    write_report(to_json(report) if args.format == "json" else to_sarif(report), args.output)
