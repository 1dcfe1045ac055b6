"""`execwatch trace`: the probe on one Linux host, printing diagnosed failed execs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import time

from prometheus_client import CollectorRegistry

from execwatch import cliargs
from execwatch.attribution import Attributor
from execwatch.cliargs import stop_on_signals
from execwatch.node.metrics import undiagnosed_summary
from execwatch.node.output import Printer
from execwatch.node.stack import NodeStack, StackOptions
from execwatch.pipeline import DIAGNOSIS_BUDGET_S, ExecutorBudget, PipelineOptions
from execwatch.probe import ProbeError
from execwatch.probe.loader import ProbeOptions
from execwatch.serving.exposition import serve

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "trace",
        help="print diagnosed failed execs, and deaths right after exec, on this host (root)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--metrics-address",
        type=cliargs.address,
        metavar="HOST:PORT",
        help="serve Prometheus metrics",
    )
    p.add_argument(
        "--show-not-found",
        action="store_true",
        help="also print ENOENT for files that do not exist (PATH-search noise)",
    )
    p.add_argument(
        "--show-crashes",
        action="store_true",
        help="also print StartupCrash: a fatal signal soon after exec that no loader rule"
        " explains (the program's own bug; always counted)",
    )
    p.add_argument(
        "--show-no-shebang",
        action="store_true",
        help="also print NoShebang: a file with neither ELF header nor #! that its caller"
        " went on from (a shell ran it; always counted)",
    )
    p.add_argument(
        "--death-window",
        type=cliargs.Number(0, 3600),
        default=2.0,
        metavar="SECONDS",
        help="a process dying this soon after it started is diagnosed as an early death",
    )
    p.add_argument(
        "--all-errnos", action="store_true", help="report every errno, not only exec ones"
    )
    p.add_argument(
        "--window",
        type=cliargs.Number(0, 3600, zero=True),
        default=1.0,
        metavar="SECONDS",
        help="repeats of one failure within this long are one line with a count (0: none are)",
    )
    p.add_argument(
        "--ringbuf-mb",
        type=cliargs.Count(1, 1024, power_of_two=True),
        default=4,
        help="ring buffer size in MiB (power of 2)",
    )
    p.add_argument(
        "--duration",
        type=cliargs.Number(0, 10**9),
        metavar="SECONDS",
        help="stop after this many seconds",
    )
    p.add_argument("--no-attribution", action="store_true", help="skip container/pod attribution")
    p.add_argument(
        "--diagnosis-budget",
        type=cliargs.Number(0, 600),
        default=DIAGNOSIS_BUDGET_S,
        metavar="SECONDS",
        help="longest wait for one diagnosis; a mount where one overran is not waited on again",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        with stop_on_signals() as stop:
            return trace_loop(args, stop)
    except BrokenPipeError:  # `execwatch trace | head`: the reader is done, so are we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ProbeError, ValueError, OSError) as exc:
        print(f"execwatch: {exc}", file=sys.stderr)
        return 2


def stack_options(args: argparse.Namespace) -> StackOptions:
    return StackOptions(
        probe=ProbeOptions(
            ringbuf_bytes=args.ringbuf_mb << 20,
            all_errnos=args.all_errnos,
            death_window_ms=args.death_window * 1000,
        ),
        pipeline=PipelineOptions(
            window=args.window,
            show_not_found=args.show_not_found,
            show_crashes=args.show_crashes,
            show_no_shebang=args.show_no_shebang,
            budget=ExecutorBudget(seconds=args.diagnosis_budget),
        ),
        make_attributor=None if args.no_attribution else Attributor,
        # A call held by the kernel for a quarter of the budget makes its mount suspect: a
        # larger budget (a slow or emulated machine) lets slow file systems be slow.
        suspect_after=max(0.25, args.diagnosis_budget / 4),
    )


def trace_loop(args: argparse.Namespace, stop: threading.Event) -> int:
    printer = Printer(sys.stdout, as_json=args.json)
    registry = CollectorRegistry()
    options = dataclasses.replace(stack_options(args), registry=registry)
    with NodeStack.open(options, printer) as stack:
        address: tuple[str, int] | None = args.metrics_address
        where = f"{address[0]}:{address[1]}" if address else "off"
        try:
            server = serve(address, stack.registry, stack.heartbeat.problem) if address else None
        except OSError as exc:
            raise ValueError(f"--metrics-address {where}: {exc.strerror or exc}") from exc
        log.info("tracing failed execs", extra={"kv": {"metrics": where}})
        deadline = time.monotonic() + args.duration if args.duration else None
        try:
            stack.run(stop, deadline)
        finally:
            if server:
                server.shutdown()
    # After the stack is closed: the records still being diagnosed are counted too.
    print(f"execwatch: {undiagnosed_summary(registry)}", file=sys.stderr)
    return 0
