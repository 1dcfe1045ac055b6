"""Platform names normalise like containerd; can_execute states what a node runs natively."""

from __future__ import annotations

import pytest

from execwatch.binfmt import Platform, can_execute, node_platform


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("linux/arm64", "linux/arm64"),
        ("arm64", "linux/arm64"),
        ("aarch64", "linux/arm64"),
        ("linux/arm64/v8", "linux/arm64"),
        ("x86_64", "linux/amd64"),
        ("linux/amd64/v3", "linux/amd64/v3"),
        ("armhf", "linux/arm/v7"),
        ("armel", "linux/arm/v6"),
        ("arm", "linux/arm/v7"),
        ("linux/arm", "linux/arm/v7"),
        ("arm/v6", "linux/arm/v6"),
        ("linux/arm/7", "linux/arm/v7"),
        ("i686", "linux/386"),
        ("ppc64el", "linux/ppc64le"),
        ("mips64el", "linux/mips64le"),
        ("Linux/AMD64", "linux/amd64"),
        ("windows/amd64", "windows/amd64"),
    ],
)
def test_parse_normalises(text: str, expected: str) -> None:
    assert str(Platform.parse(text)) == expected


@pytest.mark.parametrize("text", ["", "/", "linux//arm64", "a/b/c/d", "linux/arm 64", "lin$ux"])
def test_parse_rejects_garbage_with_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="invalid platform"):
        Platform.parse(text)


@pytest.mark.parametrize("text", ["linux/amd46", "foo", "arm65/v8", "plan9/amd64"])
def test_parse_known_rejects_what_no_image_names(text: str) -> None:
    with pytest.raises(ValueError, match=r"invalid platform .*: unknown (architecture|os)"):
        Platform.parse_known(text)


def test_parse_known_accepts_every_spelling_parse_normalises() -> None:
    assert str(Platform.parse_known("aarch64")) == "linux/arm64"
    assert str(Platform.parse_known("windows/amd64")) == "windows/amd64"


def test_str_omits_an_empty_variant() -> None:
    assert str(Platform("linux", "arm64")) == "linux/arm64"
    assert str(Platform("linux", "arm", "v7")) == "linux/arm/v7"


@pytest.mark.parametrize(
    ("machine", "expected"),
    [("x86_64", "linux/amd64"), ("aarch64", "linux/arm64"), ("armv7l", "linux/arm/v7"),
     ("armv6l", "linux/arm/v6"), ("i686", "linux/386"), ("ppc64le", "linux/ppc64le"),
     ("s390x", "linux/s390x"), ("riscv64", "linux/riscv64"), ("loongarch64", "linux/loong64")],
)  # fmt: skip
def test_node_platform_from_uname_machine(machine: str, expected: str) -> None:
    assert str(node_platform(machine)) == expected


def test_node_platform_of_this_machine_is_known() -> None:
    assert node_platform().architecture in {"amd64", "arm64", "ppc64le", "s390x", "riscv64"}


AMD64, ARM64 = Platform.parse("amd64"), Platform.parse("arm64")


@pytest.mark.parametrize(
    ("node", "binary", "compat", "runs"),
    [
        ("amd64", "amd64", False, True),
        ("amd64", "386", False, True),  # IA32 emulation
        ("386", "amd64", False, False),
        ("amd64", "arm64", False, False),
        ("arm64", "amd64", False, False),
        ("arm64", "arm/v7", False, False),  # no AArch32 unless told
        ("arm64", "arm/v7", True, True),
        ("arm/v7", "arm/v6", False, True),
        ("arm/v6", "arm/v7", False, False),
        ("arm/v7", "linux/arm", False, True),
        ("ppc64le", "ppc64", False, False),
        ("mips64le", "mips64", False, False),
        ("linux/amd64", "windows/amd64", False, False),
    ],
)
def test_can_execute(node: str, binary: str, compat: bool, runs: bool) -> None:
    assert can_execute(Platform.parse(node), Platform.parse(binary), arm32_compat=compat) is runs


def test_arm_binary_without_variant_fits_any_arm_node() -> None:
    assert can_execute(Platform.parse("arm/v5"), Platform("linux", "arm", None))
