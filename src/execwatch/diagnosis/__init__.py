"""Why did the kernel refuse to run this file? Looks at the file inside the task's root.

FileDiagnoser loads on first use, so that the handler, which needs only the diagnoses'
words (diagnosis.details), does not load the diagnoser, the probe's layouts and the
rule engine's file readers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from execwatch.diagnosis.diagnoser import FileDiagnoser

__all__ = ["FileDiagnoser"]


def __getattr__(name: str) -> Any:
    if name == "FileDiagnoser":
        from execwatch.diagnosis.diagnoser import FileDiagnoser

        return FileDiagnoser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
