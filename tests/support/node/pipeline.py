"""A NodePipeline built from the options a test names, flat: `budget=0.3, workers=1`."""

from __future__ import annotations

import dataclasses
from typing import Any

from execwatch.pipeline import ExecutorBudget, NodePipeline, PipelineOptions, Sink

_BUDGET = {f.name for f in dataclasses.fields(ExecutorBudget)} | {"budget"}
_OPTIONS = {f.name for f in dataclasses.fields(PipelineOptions)} - {"budget"}


def make_pipeline(diagnoser: Any, sink: Sink, **kw: Any) -> NodePipeline:
    """`budget` is the seconds of ExecutorBudget; every other option keeps its field's name, and
    what is left (observer, heartbeat, slow, folds, attributor) goes to NodePipeline."""
    budget = {("seconds" if k == "budget" else k): kw.pop(k) for k in _BUDGET & kw.keys()}
    options = {k: kw.pop(k) for k in _OPTIONS & kw.keys()}
    return NodePipeline(
        diagnoser,
        sink,
        PipelineOptions(**options, budget=ExecutorBudget(**budget)),
        epoch_offset=kw.pop("epoch_offset", 0.0),
        **kw,
    )
