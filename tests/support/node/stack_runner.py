"""The node stack as the tests run it: `NodeStack.open` into a list (or the test's own
sink), with a consume loop or a plain poller on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from execwatch.node.stack import NodeStack, StackOptions
from execwatch.pipeline import NodePipeline
from execwatch.probe import Probe
from execwatch.record import ExecFailure

Loop = Literal["none", "run", "poll"]


@dataclass
class Running:
    """An open stack, what its sink received in order (when the sink is the list), and
    the thread that polls it."""

    stack: NodeStack
    records: list[ExecFailure] = field(default_factory=list)
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def probe(self) -> Probe:
        return self.stack.probe

    @property
    def pipeline(self) -> NodePipeline:
        return self.stack.pipeline

    def stop_loop(self) -> None:
        """Stop the loop: after "run", the pipeline has drained and flushed all."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
            assert not self.thread.is_alive(), "the node stack's loop did not stop within 30 s"


@contextmanager
def node_stack(
    options: StackOptions,
    sink: Callable[[ExecFailure], None] | None = None,
    *,
    loop: Loop = "none",
) -> Iterator[Running]:
    """`loop`: "run" is the consume loop of trace and the agent (it flushes each window),
    "poll" only polls the probe all the time, "none" leaves polling to the test."""
    records: list[ExecFailure] = []
    with NodeStack.open(options, sink or records.append) as stack:
        running = Running(stack, records)
        if loop != "none":
            running.thread = threading.Thread(
                target=_run if loop == "run" else _poll, args=(running,), daemon=True
            )
            running.thread.start()
        try:
            yield running
        finally:
            running.stop_loop()


def _run(running: Running) -> None:
    running.stack.run(running.stopping)


def _poll(running: Running) -> None:
    while not running.stopping.is_set():
        running.probe.poll(50)
