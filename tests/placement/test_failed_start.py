"""What a container starts that fails on every architecture: an entrypoint without `#!`,
a macOS or Windows build. Placement cannot help: the pod is ungated unchanged, never
narrowed nor held, with a Warning Event naming the file. Against the real registry and
API server; the Mach-O and PE files are real Go cross-compiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from tests.placement.cluster import create_pod
from tests.placement.test_scanned import enforced, left_as_is, placer
from tests.support.images.base_images import glibc_base
from tests.support.images.imagebuild import Image, file, oci_layout, symlink
from tests.support.registry.registry_fixtures import arm64_root
from tests.support.registry.registry_server import Registry

CASES: dict[
    str, tuple[bytes | str, str]
] = {  # image -> (its /app/run: bytes, or a cached build's name; what the Event says)
    "no-shebang": (b"echo hello\n", "no #! interpreter line"),
    "bom": (b"\xef\xbb\xbf#!/bin/sh\necho hello\n", "a UTF-8 byte order mark"),
    "macos": ("hello-darwin-arm64", "a macOS arm64 executable (Mach-O): built with GOOS=darwin?"),
    "windows": (
        "hello-windows-amd64.exe",
        "a Windows x86-64 executable (PE): built with GOOS=windows?",
    ),
}


def content(case: str, foreign_os: dict[str, Path]) -> bytes:
    data = CASES[case][0]
    return data if isinstance(data, bytes) else foreign_os[data].read_bytes()


@pytest.fixture(scope="module")
def broken(
    registry: Registry,
    built: dict[str, Path],
    host_glibc: dict[str, bytes],
    foreign_root: Path,
    foreign_os: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """Per case, an image of both architectures whose entrypoint is /app/run, each with a
    shell of its own architecture for the `sh -c` case (the host's hello stands in for
    amd64's, Debian's busybox is arm64's)."""
    out = {}
    for case in CASES:
        run = file("app/run", content(case, foreign_os))
        amd64 = [glibc_base(host_glibc), [run, file("usr/bin/sh", built["glibc"].read_bytes())]]
        arm64 = [arm64_root(foreign_root), [run, symlink("usr/bin/sh", "busybox")]]
        images = [Image(layers, arch, entrypoint=["/app/run"])
                  for layers, arch in ((amd64, "amd64"), (arm64, "arm64"))]  # fmt: skip
        layout = oci_layout(tmp_path_factory.mktemp(case), images)
        out[case] = registry.push(layout, f"team/{case}:1")
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_program_no_architecture_runs_is_ungated_unchanged_with_a_warning(
    registered: object,
    admin: client.ApiClient,
    registry: Registry,
    broken: dict[str, str],
    tmp_path: Path,
    case: str,
) -> None:
    ns, secrets = enforced(admin, registry)
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[
        {"name": "app", "image": broken[case]}])  # fmt: skip

    outcome = placer(admin, registry, tmp_path).handle(pod)

    kind, reason, note = left_as_is(admin, pod, outcome)
    assert (kind, reason) == ("Warning", "PlacementUnchanged")
    assert note.startswith("fails on every node architecture, left as is: container 'app'")
    assert "/app/run: " in note and CASES[case][1] in note


def test_a_script_without_shebang_run_by_sh_c_is_no_failure(
    registered: object, admin: client.ApiClient, registry: Registry, broken: dict[str, str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """The shell retries it with /bin/sh: the benign case stays benign."""
    ns, secrets = enforced(admin, registry)
    app = {"name": "app", "image": broken["no-shebang"], "command": ["sh", "-c", "/app/run"]}
    pod = create_pod(admin, ns, imagePullSecrets=secrets, containers=[app])

    outcome = placer(admin, registry, tmp_path).handle(pod)

    assert left_as_is(admin, pod, outcome) == (
        "Normal",
        "PlacementUnchanged",
        "runs on every node architecture",
    )


def test_a_crlf_shebang_is_judged_per_architecture_as_before(
    registered: object, admin: client.ApiClient, registry: Registry, tmp_path: Path,
    built: dict[str, Path], host_glibc: dict[str, bytes],
) -> None:  # fmt: skip
    """A scan-only check of the program (shebang-crlf, no Reason of its own) is not one of
    the every-architecture reasons: it decides as any failure does, held everywhere."""
    layer = [
        file("app/run", b"#!/bin/sh\r\necho hi\r\n"),
        file("usr/bin/sh", built["glibc"].read_bytes()),
    ]
    images = [
        Image([glibc_base(host_glibc), layer], a, entrypoint=["/app/run"])
        for a in ("amd64", "arm64")
    ]
    image = registry.push(oci_layout(tmp_path / "crlf", images), "team/crlf:1")
    ns, secrets = enforced(admin, registry)
    pod = create_pod(
        admin, ns, imagePullSecrets=secrets, containers=[{"name": "app", "image": image}]
    )

    outcome = placer(admin, registry, tmp_path).handle(pod)

    assert outcome is not None and outcome.action == "nowhere", outcome
    assert "#! line ends in CR" in outcome.message
