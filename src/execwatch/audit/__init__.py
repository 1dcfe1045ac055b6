"""`execwatch audit`: which workloads of a running cluster would fail on which architectures.

cluster (workloads, pods, nodes) -> images pinned by digest x schedulable architectures ->
the scanner, per platform -> verdicts per workload, cached by image digest.
"""
