"""`execwatch scan`: will these executables start on the platforms they claim?

Data path: input (file, rootfs, OCI layout, archive) -> images (one per platform) ->
layers applied to an in-memory filesystem view -> checks -> report. ELF and `#!` knowledge
comes from execwatch.binfmt, shared with the runtime diagnosis.
"""

from execwatch.scan.errors import ScanInputError
from execwatch.scan.model import Check, Finding, ImageResult, ScanReport, Severity
from execwatch.scan.runner import ScanOptions, scan

__all__ = [
    "Check",
    "Finding",
    "ImageResult",
    "ScanInputError",
    "ScanOptions",
    "ScanReport",
    "Severity",
    "scan",
]
