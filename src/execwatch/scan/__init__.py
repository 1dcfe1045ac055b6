"""`execwatch scan`: will these executables start on the platforms they claim?

Data path: input (file, rootfs, OCI layout, archive) -> images (one per platform) ->
layers applied to a filesystem view -> the rules -> findings with severities -> report.
The views, the linker and the rules are execwatch.runnable's, shared with the node's
diagnosis; a finding's check name spells its Reason (vocabulary.py).
"""

from execwatch.scan.errors import ScanInputError
from execwatch.scan.model import Finding, ImageResult, ScanReport, Severity
from execwatch.scan.runner import ScanOptions, scan, scan_image
from execwatch.scan.vocabulary import Check

__all__ = [
    "Check",
    "Finding",
    "ImageResult",
    "ScanInputError",
    "ScanOptions",
    "ScanReport",
    "Severity",
    "scan",
    "scan_image",
]
