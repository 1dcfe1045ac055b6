"""The `execwatch` command line."""

from __future__ import annotations

import argparse
import sys

from execwatch import __version__, logs, trace
from execwatch.audit import cli as audit_cli
from execwatch.cluster import cli as cluster_cli
from execwatch.scan import cli as scan_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="execwatch", description="Catch and explain binaries that fail to start."
    )
    parser.add_argument("--version", action="version", version=f"execwatch {__version__}")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    trace.add_parser(sub)
    scan_cli.add_parser(sub)
    audit_cli.add_parser(sub)
    cluster_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
