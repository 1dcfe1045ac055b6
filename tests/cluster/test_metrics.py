"""The handler's metrics stay bounded whatever the agents put in their records."""

from __future__ import annotations

from execwatch.binfmt.platform import OCI_ARCHITECTURES
from execwatch.handler.metrics import OTHER_ARCH, OVERFLOW, HandlerMetrics, arch_label


def series(m: HandlerMetrics, family: str) -> list[dict[str, str]]:
    return [
        s.labels
        for f in m.registry.collect()
        if f.name == family
        for s in f.samples
        if s.name.endswith("_total")
    ]


def total(m: HandlerMetrics, family: str) -> float:
    return sum(
        s.value
        for f in m.registry.collect()
        if f.name == family
        for s in f.samples
        if s.name.endswith("_total")
    )


def test_architectures_outside_the_oci_set_are_other() -> None:
    assert {"amd64", "arm64", "riscv64", "loong64"} <= OCI_ARCHITECTURES
    assert arch_label("arm64") == "arm64" and arch_label("") == ""
    for forged in ("arm64\n", "ARM64", "x" * 32, "ppc (32-bit)", "amd64 "):
        assert arch_label(forged) == OTHER_ARCH


def test_agent_supplied_architectures_cannot_bypass_the_series_cap() -> None:
    """300 invented architectures used to make 300 series past max_series=10."""
    m = HandlerMetrics(max_series=10)
    for i in range(300):
        labels: dict[str, str | None] = {
            "namespace": "ns",
            "workload": "app",
            "container": "c",
            "node": "n",
            "node_arch": f"arch{i}",
            "binary_arch": f"bin{i}",
            "reason": "ForeignArchitecture",
        }
        m.count_failures(labels, 1)
    got = series(m, "execwatch_exec_failures")
    assert len(got) == 1 and got[0]["node_arch"] == got[0]["binary_arch"] == OTHER_ARCH
    assert total(m, "execwatch_exec_failures") == 300


def test_unattributed_failures_are_capped_and_counted_in_full() -> None:
    m = HandlerMetrics(max_series=10)
    for i in range(300):
        m.count_unattributed(f"node-{i}", "amd64", "ForeignArchitecture", "no_pod", 2)
    got = series(m, "execwatch_handler_unattributed")
    assert len(got) <= 11
    assert {s["node"] for s in got} >= {OVERFLOW}
    assert total(m, "execwatch_handler_unattributed") == 600
    assert total(m, "execwatch_handler_series_overflow") == 2 * (300 - 10)


def test_metric_label_values_are_escaped() -> None:
    m = HandlerMetrics()
    m.count_unattributed("node-a\nforged 1", "amd64", "ForeignArchitecture", "no_pod", 1)
    [labels] = series(m, "execwatch_handler_unattributed")
    assert "\n" not in labels["node"]
