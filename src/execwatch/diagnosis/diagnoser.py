"""Classifying a failed exec by reading the file the kernel refused, as the task saw it.

The errno says what the kernel concluded; the file says why. FileDiagnoser finds the
caller's root (roots.py), opens the file there (target.py) and has it judged
(examine.py); an early death goes to startup.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Protocol

from execwatch.attribution.engine_api import Layers
from execwatch.binfmt import Platform, node_platform
from execwatch.diagnosis.budget import SlowFileSystem, SlowMounts
from execwatch.diagnosis.container_rootfs import Candidate, ContainerRootfs
from execwatch.diagnosis.engine_root import EngineRoots
from execwatch.diagnosis.examine import Context, Examiner
from execwatch.diagnosis.roots import RootLocator
from execwatch.diagnosis.startup import StartupDiagnoser
from execwatch.diagnosis.target import TargetOpener
from execwatch.probe import events
from execwatch.record import (
    Diagnosis,
    EarlyDeath,
    Emulated,
    ExecFailed,
    KernelEvent,
    Reason,
    UndiagnosedCause,
)
from execwatch.runnable.openat2 import Resolver, Root
from execwatch.runnable.reason import emulated_detail


class ContainerIds(Protocol):
    """What the diagnosis needs from attribution: the container a cgroup belongs to."""

    def container_id(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> str | None: ...

    def engine_layers(
        self, cgroup_id: int, pid: int | None = None, *, name: str = "", parent_id: int = 0
    ) -> tuple[str, Layers] | None: ...


class FileDiagnoser:
    @classmethod
    def for_host(
        cls, containers: ContainerIds | None, slow: SlowMounts | None = None
    ) -> FileDiagnoser:
        """Also looks at a dead container's rootfs, found from its id, when no task is left."""
        if containers is None:
            return cls(slow=slow)
        rootfs = ContainerRootfs()

        def container_rootfs(event: KernelEvent) -> Iterator[Candidate]:
            container_id = event.container_id
            if container_id is None:
                container_id = _container_of(containers, event)
            return rootfs.candidates(container_id or None, parent=event.ppid)

        engine_roots = EngineRoots()

        def engine_root(event: KernelEvent) -> Root | None:
            found = containers.engine_layers(
                event.cgroup_id,
                event.tgid,
                name=event.cgroup_name,
                parent_id=event.cgroup_parent_id,
            )
            return engine_roots.open(*found) if found is not None else None

        locator = RootLocator(extra=[container_rootfs], last=[engine_root])
        made = cls(locator, slow=slow)
        made._containers = containers
        return made

    def prepare(self, event: KernelEvent) -> KernelEvent:
        """In the agent, before a diagnosis worker takes the event: what only the agent's
        live state knows (the container of the cgroup, from the attribution inventory), and
        the caller's root, opened now (`root_fd`, the caller's to close): a dying task or
        container is gone within milliseconds, and the open fd pins its file system."""
        if not events.reads_files(event):
            return event  # diagnosed from the record alone
        if self._containers is not None and event.container_id is None:
            container = _container_of(self._containers, event) or ""
            event = dataclasses.replace(event, container_id=container)
        root = self._locator.open(event)
        if root is None:
            return event
        return dataclasses.replace(event, root_fd=root.fd, root_description=root.description)

    def __init__(
        self,
        locator: RootLocator | None = None,
        node: Platform | None = None,
        slow: SlowMounts | None = None,
    ) -> None:
        self._locator = locator or RootLocator()
        self._node = node or node_platform()
        resolver = Resolver(slow)
        self._target = TargetOpener(self._locator, resolver, slow)
        self._examiner = Examiner(self._node, resolver)
        self._startup = StartupDiagnoser(self._locator, self._node, slow)
        self._containers: ContainerIds | None = None

    @property
    def node_arch(self) -> str:
        return self._node.architecture

    def diagnose(self, event: KernelEvent) -> Diagnosis:
        """By the event's kind: its probe.events.KINDS entry's diagnosis."""
        return events.diagnose(self, event)

    def early_death(self, event: EarlyDeath) -> Diagnosis:
        return self._startup.diagnose(event)

    def emulated_exec(self, event: Emulated) -> Diagnosis:
        return emulated(event, self._node.architecture)

    def exec_failed(self, event: ExecFailed) -> Diagnosis:
        root = self._locator.open(event)
        if root is None:
            return self._examiner.result(
                Reason.UNDIAGNOSED,
                detail="the task is gone and no live task or rootfs has its root",
                cause=UndiagnosedCause.GONE,
            )
        try:
            return self._diagnose_in(Context(root, event.errno), event)
        except SlowFileSystem as exc:
            return self._examiner.result(
                Reason.UNDIAGNOSED,
                detail=f"not waited for: {exc}",
                cause=UndiagnosedCause.SLOW_MOUNT,
            )
        finally:
            root.close()

    def _diagnose_in(self, ctx: Context, event: ExecFailed) -> Diagnosis:
        try:
            fd = self._target.open(ctx.root, event)
        except OSError as exc:
            return self._examiner.unopened(ctx, exc)
        with os.fdopen(fd, "rb") as f:
            return self._examiner.examine(ctx, f.fileno(), event.path)


def emulated(event: Emulated, node_arch: str) -> Diagnosis:
    """The kernel named the architecture (the entry's magic) and the emulator: no file to read."""
    return Diagnosis(
        Reason.EMULATED,
        node_arch,
        binary_arch=event.emulated_arch or "foreign",
        interpreter=event.emulator,
        detail=emulated_detail(event.emulated_arch, event.emulator, node_arch),
    )


def _container_of(containers: ContainerIds, event: KernelEvent) -> str | None:
    return containers.container_id(
        event.cgroup_id, event.tgid, name=event.cgroup_name, parent_id=event.cgroup_parent_id
    )
