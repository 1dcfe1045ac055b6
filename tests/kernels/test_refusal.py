"""A kernel that lacks what the probe needs is refused at start, in one line."""

from __future__ import annotations

import os

import pytest

from execwatch import cli
from execwatch.probe import loader


def test_a_missing_kernel_feature_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """This kernel's verifier really refuses a helper id it does not know."""
    future = loader.KernelFeature("bpf_helper_from_the_future", "99.0", helper=100_000)
    monkeypatch.setattr(loader, "REQUIRED", (*loader.REQUIRED, future))

    code = cli.main(["trace", "--no-attribution", "--duration", "1"])

    release = os.uname().release
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"execwatch: this kernel ({release}) lacks bpf_helper_from_the_future (Linux 99.0+): "
        "execwatch needs Linux 5.10 or later"
    ]


def test_every_required_feature_is_found_here() -> None:
    with loader.Probe() as probe:
        assert all(probe.features[f.name] for f in loader.REQUIRED)


@pytest.mark.parametrize(
    ("release", "version"),
    [("5.10.0-46-amd64", (5, 10)), ("6.12.118+deb13-amd64", (6, 12)), ("7.2.13", (7, 2)),
     ("5.14.0-503.el9.x86_64", (5, 14)), ("garbage", (0, 0))],
)  # fmt: skip
def test_kernel_version_of_a_release(release: str, version: tuple[int, int]) -> None:
    assert loader.kernel_version(release) == version


def test_every_kernel_version_comes_from_compat_bpf_h_with_its_change() -> None:
    """One table of kernel versions (bpf/compat.bpf.h); the loader's features read it."""
    features = (*loader.REQUIRED, *loader.OPTIONAL)
    assert all(f.since == loader.KERNEL[f.name].since for f in features)
    assert loader.OLDEST_TESTED == (5, 10)
    for row in loader.KERNEL.values():
        assert loader.kernel_version(row.since) > (3, 0), row
        assert row.change, row
    assert set(loader.KERNEL) >= {"supported", "tp_btf", "linux_binprm_interpreter"}
