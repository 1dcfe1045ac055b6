"""What the commands share: option types, the API flags, a start-up refusal, and stopping
on SIGINT/SIGTERM. Option types: a value out of range is a one-line usage error
(exit 2) when the command line is parsed, before a probe is loaded or a port bound.

Every bound says what the option can mean: a zero rate would divide by zero in the
publisher's token bucket, a negative duration would end `trace` at once with exit 0 (a
silent "all clear"), a 100 GB ring buffer would stall the kernel's allocator.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from execwatch.text import one_line

# The top-level parser imports this module for every command (`execwatch --version` too):
# binfmt (40 ms) loads only in the option types that use it.
if TYPE_CHECKING:
    from execwatch.binfmt.platform import Platform
    from execwatch.scan.egress import Network as IPNetwork


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, pointing at --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Number:
    """A finite number in (low, high], or [low, high] with `zero`. The chart's
    values.schema.json is tested against these bounds."""

    low: float
    high: float
    zero: bool = False
    unit: str = "SECONDS"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = self.low <= value if self.zero else self.low < value
        if not (math.isfinite(value) and above and value <= self.high):
            op = "<=" if self.zero else "<"
            raise argparse.ArgumentTypeError(
                f"wants {_num(self.low)} {op} {self.unit} <= {_num(self.high)}, got {text!r}"
            )
        return value


@dataclass(frozen=True)
class Count:
    """A whole number in [low, high], with `power_of_two` one of 1, 2, 4, ..."""

    low: int
    high: int
    power_of_two: bool = False

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = self.low - 1
        if not self.low <= value <= self.high or (self.power_of_two and value & (value - 1)):
            what = "a power of two" if self.power_of_two else "N"
            raise argparse.ArgumentTypeError(
                f"wants {what} in {self.low}..{self.high}, got {text!r}"
            )
        return value


class Renamed(argparse.Action):
    """An option that is gone: naming it is a usage error that names its successor, never
    a value quietly read with another meaning."""

    def __init__(self, option_strings: list[str], dest: str, *, successor: str, **_: object):
        super().__init__(
            option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        self.successor = successor

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} is gone: use {self.successor}")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all addresses) or `[v6]:PORT`, for a listening socket."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"wants HOST:PORT with a port in 0..65535, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def dns_label(text: str) -> str:
    """A name Kubernetes keeps as an RFC 1123 label (a namespace): refused here, not by
    the API server on every record the agent then creates."""
    if len(text) > 63 or not re.fullmatch(_LABEL, text):
        raise argparse.ArgumentTypeError(
            f"wants a DNS label (a-z, 0-9 and '-', at most 63), got {text!r}"
        )
    return text


def dns_subdomain(text: str) -> str:
    """A name Kubernetes keeps as an RFC 1123 subdomain (a node, a Lease)."""
    if len(text) > 253 or not re.fullmatch(rf"{_LABEL}(\.{_LABEL})*", text):
        raise argparse.ArgumentTypeError(
            f"wants a DNS subdomain (a-z, 0-9, '-' and '.', at most 253), got {text!r}"
        )
    return text


def platform(text: str) -> Platform:
    """`os/arch[/variant]` naming an OCI architecture (see Platform.parse_known)."""
    from execwatch.binfmt.platform import Platform

    try:
        return Platform.parse_known(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def cpu_level(text: str) -> int:
    """An x86-64 level, `x86-64-v1` to `x86-64-v4` (see binfmt.isa.parse_level)."""
    from execwatch.binfmt.isa import parse_level

    try:
        return parse_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def architecture(text: str) -> str:
    """An architecture as Kubernetes' `kubernetes.io/arch` label spells it: `aarch64` is
    `arm64`, and a name no OCI image uses is refused instead of checked as a CPU."""
    return platform(text).architecture


def network(text: str) -> IPNetwork:
    """An address or a CIDR (`127.0.0.0/8`, `10.1.2.3`, `fd00::/8`)."""
    from execwatch.scan.egress import parse_network

    try:
        return parse_network(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"wants an address or a CIDR, got {text!r}") from exc


def readable_file(text: str) -> str:
    """A file the user named: a typo must not quietly mean "no credentials" or "no CA"."""
    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"no readable file {text!r}")
    return text


def size(text: str) -> int:
    """Bytes, with an optional K, M, G or T (powers of 1024): `2G`, `512MiB`, `0`."""
    m = re.fullmatch(r"(\d+)([KMGT]?)I?B?", text.strip().upper())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2) or " "))


NAMESPACE_HELP = "namespace of the ExecFailure records (default: $POD_NAMESPACE or execwatch)"


def attach_values(argv: Sequence[str], options: Collection[str]) -> list[str]:
    """`--opt VALUE` as `--opt=VALUE` for the options whose value may itself start with a
    dash (`--run-args --version`), which argparse would otherwise read as an option."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        value = next(words, None) if word in options else None
        out.append(word if value is None else f"{word}={value}")
    return out


def add_api_flags(p: argparse.ArgumentParser, namespace_help: str = NAMESPACE_HELP) -> None:
    """--kubeconfig and --namespace (of the ExecFailure records, unless `namespace_help`
    says what else) of the cluster commands."""
    from execwatch.crd import DEFAULT_NAMESPACE

    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    p.add_argument(
        "--namespace",
        type=dns_label,
        default=os.environ.get("POD_NAMESPACE", DEFAULT_NAMESPACE),
        help=namespace_help,
    )


def refused(message: str) -> int:
    """A start-up refusal: one line on stderr, exit 2."""
    print(f"execwatch: {one_line(message)}", file=sys.stderr)
    return 2


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
