"""Placement by binary truth: pods go only to the architectures their binaries run on.

A mutating webhook gates new pods of opted-in namespaces; a controller narrows each
gated pod's required node affinity to the architectures where what it starts really
runs, then lifts the gate (docs/placement.md).
"""
