"""Loading the BPF program, reading its ring buffer and its exact kernel counters."""

from execwatch.probe.loader import Probe, ProbeError

__all__ = ["Probe", "ProbeError"]
