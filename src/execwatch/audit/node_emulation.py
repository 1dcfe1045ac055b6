"""Which architectures the cluster's nodes run through binfmt_misc emulators (`--emulates`).

A node with a user-mode QEMU registered for architecture X (qemu-user-static,
binfmt-support, a tonistiigi/binfmt DaemonSet) starts X's binaries instead of failing
with exec format error: slowly, and only there. The agent exports what each node has
(`execwatch_node_binfmt_emulators{node, emulated_arch, flags}`); the audit is told, so
it needs no privilege beyond its `list` verbs.

`--emulates arm64,riscv64` means every node runs those; `--emulates amd64=arm64` only
the nodes of architecture amd64. A node's own architecture is never emulated.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from execwatch import cliargs

EVERY_NODE = "*"


@dataclass(frozen=True)
class Emulation:
    """Node architecture (or EVERY_NODE) -> the architectures its nodes emulate."""

    by_node_arch: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def of(self, node_arch: str) -> frozenset[str]:
        every = self.by_node_arch.get(EVERY_NODE, frozenset())
        return (every | self.by_node_arch.get(node_arch, frozenset())) - {node_arch}

    @classmethod
    def of_options(cls, options: Iterable[tuple[str, frozenset[str]]]) -> Emulation:
        """The `--emulates` values (emulates()), merged per node architecture."""
        found: dict[str, frozenset[str]] = {}
        for node_arch, archs in options:
            found[node_arch] = found.get(node_arch, frozenset()) | archs
        return cls(found)


def emulates(text: str) -> tuple[str, frozenset[str]]:
    """argparse type of one `--emulates` value, `[NODE_ARCH=]ARCH[,ARCH]`."""
    node, _, archs = text.rpartition("=")
    names = [a.strip() for a in archs.split(",") if a.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"names no architecture: {text!r}")
    key = cliargs.architecture(node) if node else EVERY_NODE
    return key, frozenset(cliargs.architecture(a) for a in names)
