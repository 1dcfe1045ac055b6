"""Every input kind, on real Debian binaries: OCI layouts, indexes, archives, rootfs, layers."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.support.images.imagebuild import (
    Entry,
    Image,
    directory,
    docker25_archive,
    file,
    hardlink,
    layer_tar,
    legacy_docker_archive,
    oci_layout,
    symlink,
    tree,
    usrmerge,
)
from tests.support.scan.scan_cli import checks, scan_json

# debian arch -> (OCI architecture, variant)
ARCHS = {
    "arm64": ("arm64", None),
    "armhf": ("arm", "v7"),
    "i386": ("386", None),
    "ppc64el": ("ppc64le", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
    "mips64el": ("mips64le", None),
}


def debian_image(foreign_root: Path, debarch: str, **kwargs: object) -> Image:
    root = foreign_root / debarch / "root"
    arch, variant = ARCHS[debarch]
    return Image([tree(root) + usrmerge(root)], arch, variant=variant, **kwargs)  # type: ignore[arg-type]


def libc_lacks_2_38(foreign_root: Path, debarch: str) -> bool:
    """trixie's hello needs GLIBC_2.38; the mirror may have given bookworm's glibc 2.36."""
    debs = foreign_root / "debs"
    trixie_hello = any(debs.glob(f"hello_2.10-5_{debarch}.deb"))
    return trixie_hello and any(debs.glob(f"libc6_2.36-*_{debarch}.deb"))


@pytest.mark.parametrize("debarch", sorted(ARCHS))
def test_debian_root_of_each_architecture_runs_on_its_platform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path, debarch: str
) -> None:
    image = debian_image(foreign_root, debarch, entrypoint=["/usr/bin/hello"])
    layout = oci_layout(tmp_path / "layout", [image])
    code, doc = scan_json(capsys, str(layout))
    (result,) = doc["images"]
    assert result["platform"] == "linux/" + "/".join(p for p in ARCHS[debarch] if p)
    assert result["stats"]["elf"] >= 3
    if libc_lacks_2_38(foreign_root, debarch):
        (finding,) = doc["findings"]
        assert finding["check"] == "missing-symbol-version"
        assert "version `GLIBC_2.38' not found (required by /usr/bin/hello)" in finding["message"]
        assert finding["entrypoint"] is True and code == 1
    else:
        assert (code, doc["findings"]) == (0, [])


def test_multi_platform_index_checks_every_platform_and_skips_attestations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    images = [debian_image(foreign_root, a) for a in ("arm64", "armhf", "riscv64")]
    layout = oci_layout(tmp_path / "layout", images, attest=True)
    code, doc = scan_json(capsys, str(layout))
    assert [r["platform"] for r in doc["images"]] == [
        "linux/arm64",
        "linux/arm/v7",
        "linux/riscv64",
    ]
    assert (code, doc["findings"]) == (0, [])
    code, doc = scan_json(capsys, str(layout), "--platform", "linux/arm/v7")
    assert [r["platform"] for r in doc["images"]] == ["linux/arm/v7"]
    code, doc = scan_json(
        capsys, str(layout), "--platform", "linux/riscv64", "--platform", "linux/arm/v7"
    )
    assert [r["platform"] for r in doc["images"]] == ["linux/riscv64", "linux/arm/v7"]


def test_asking_for_a_platform_the_index_lacks_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    layout = oci_layout(tmp_path / "layout", [debian_image(foreign_root, "arm64")], nested=True)
    capsys.readouterr()
    from tests.support.scan.scan_cli import scan_error

    message = scan_error(capsys, str(layout), "--platform", "linux/s390x")
    assert "no linux/s390x image (the input has: linux/arm64)" in message


def test_config_that_lies_about_its_architecture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    """FROM --platform=$BUILDPLATFORM: config says arm64, the binaries are s390x."""
    root = foreign_root / "s390x" / "root"
    image = Image([tree(root) + usrmerge(root)], "arm64")
    code, doc = scan_json(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert code == 1
    image_level = [f for f in doc["findings"] if f["path"] == "(image config)"]
    assert len(image_level) == 1
    assert "config says linux/arm64 but" in image_level[0]["message"]
    assert "are linux/s390x" in image_level[0]["message"]
    assert ("arch-mismatch", "/usr/bin/hello") in checks(doc)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_layer_compressions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path, compression: str
) -> None:
    image = debian_image(foreign_root, "arm64", compression=compression)
    layout = oci_layout(tmp_path / "l", [image], nested=True)
    code, doc = scan_json(capsys, str(layout), "--platform", "linux/arm64")
    assert (code, doc["findings"]) == (0, [])
    assert doc["images"][0]["stats"]["elf"] >= 3


def test_docker25_archive_and_legacy_docker_save_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    image = debian_image(foreign_root, "riscv64")
    image.layers.append([file("usr/bin/dos", b"#!/bin/sh\r\n")])
    new = docker25_archive(tmp_path, image, tmp_path / "docker25.tar")
    old = legacy_docker_archive(image, tmp_path / "legacy.tar")
    _, doc_new = scan_json(capsys, str(new))
    _, doc_old = scan_json(capsys, str(old))
    assert checks(doc_new) == checks(doc_old) == {("shebang-crlf", "/usr/bin/dos")}
    assert doc_new["images"][0]["platform"] == doc_old["images"][0]["platform"] == "linux/riscv64"


def test_gzipped_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    import gzip

    plain = docker25_archive(tmp_path, debian_image(foreign_root, "arm64"), tmp_path / "i.tar")
    packed = tmp_path / "i.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    code, doc = scan_json(capsys, str(packed))
    assert (code, doc["findings"]) == (0, [])


def test_rootfs_directory_with_platform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(foreign_root / "i386" / "root", root, symlinks=True)
    shutil.rmtree(root / "usr/share")
    for name in ("bin", "lib"):
        (root / name).symlink_to(f"usr/{name}")
    code, doc = scan_json(capsys, str(root), "--platform", "linux/386")
    assert (code, doc["findings"]) == (0, [])
    code, doc = scan_json(capsys, str(root), "--platform", "linux/arm64")
    assert ("arch-mismatch", "/usr/bin/hello") in checks(doc)
    # an amd64 node runs 386 binaries (IA32 emulation): no arch finding
    code, doc = scan_json(capsys, str(root), "--platform", "linux/amd64")
    assert (code, doc["findings"]) == (0, [])
    # several platforms: one result for each, each checked against its own
    code, doc = scan_json(
        capsys, str(root), "--platform", "linux/amd64", "--platform", "linux/arm64"
    )
    assert [r["platform"] for r in doc["images"]] == ["linux/amd64", "linux/arm64"]
    assert {f["platform"] for f in doc["findings"]} == {"linux/arm64"}
    assert ("arch-mismatch", "/usr/bin/hello") in checks(doc) and code == 1


def test_rootfs_tarball_is_one_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    root = foreign_root / "arm64" / "root"
    archive = tmp_path / "rootfs.tar"
    archive.write_bytes(layer_tar(tree(root) + usrmerge(root)))
    code, doc = scan_json(capsys, str(archive), "--platform", "arm64")
    assert (code, doc["findings"]) == (0, [])
    code, doc = scan_json(capsys, str(archive), "--platform", "arm64", "--platform", "s390x")
    assert [r["platform"] for r in doc["images"]] == ["linux/arm64", "linux/s390x"]
    assert {f["platform"] for f in doc["findings"] if f["check"] == "arch-mismatch"} == {
        "linux/s390x"
    }


def arm64_layers(foreign_root: Path) -> list[Entry]:
    root = foreign_root / "arm64" / "root"
    return tree(root) + usrmerge(root)


def test_whiteout_deletes_a_lower_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    delete_loader = [file("usr/lib/.wh.ld-linux-aarch64.so.1", b"", 0o644)]
    image = Image([arm64_layers(foreign_root), delete_loader], "arm64")
    _, doc = scan_json(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert ("missing-interpreter", "/usr/bin/hello") in checks(doc)


def test_opaque_directory_hides_lower_children_but_not_its_own_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    hello = (foreign_root / "arm64/root/usr/bin/hello").read_bytes()
    lower = [file("opt/app/old", b"#!/bin/missing\n"), file("opt/app/keep", b"#!/bin/missing\n")]
    upper = [
        directory("opt/app"),
        file("opt/app/new", hello),  # before the marker: still this layer's own entry
        file("opt/app/.wh..wh..opq", b"", 0o644),
        file("opt/app/newer", b"#!/bin/also-missing\n"),
    ]
    image = Image([arm64_layers(foreign_root), lower, upper], "arm64")
    _, doc = scan_json(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert {p for _, p in checks(doc)} == {"/opt/app/newer"}
    assert doc["images"][0]["stats"]["elf"] >= 4  # /opt/app/new was scanned


def test_hardlink_to_a_lower_layer_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    plain = Image([arm64_layers(foreign_root)], "arm64")
    _, before = scan_json(capsys, str(oci_layout(tmp_path / "a", [plain])))
    layer = [hardlink("usr/local/bin/hello-again", "usr/bin/hello")]
    image = Image([arm64_layers(foreign_root), layer], "arm64")
    _, after = scan_json(capsys, str(oci_layout(tmp_path / "b", [image])))
    assert after["findings"] == []
    assert after["images"][0]["stats"]["elf"] == before["images"][0]["stats"]["elf"] + 1


def test_interpreter_found_through_absolute_and_relative_symlinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    root = foreign_root / "arm64" / "root"
    entries = [e for e in tree(root) if e.path != "usr/lib/ld-linux-aarch64.so.1"]
    winding = "aarch64-linux-gnu/../aarch64-linux-gnu/ld-linux-aarch64.so.1"
    entries += [symlink("lib", "/usr/lib"), symlink("usr/lib/ld-linux-aarch64.so.1", winding)]
    image = Image([entries], "arm64")
    code, doc = scan_json(capsys, str(oci_layout(tmp_path / "l", [image])))
    assert (code, doc["findings"]) == (0, [])


def test_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    layout = oci_layout(tmp_path / "l", [debian_image(foreign_root, "arm64")])
    out = tmp_path / "report.json"
    from tests.support.scan.scan_cli import run

    assert run([str(layout), "--format", "json", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["findings"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l", "report.json"]
    assert tarfile is not None


def test_output_to_a_fifo_writes_through_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], foreign_root: Path
) -> None:
    """`-o /dev/null` as root must not replace the device: a FIFO stands in for it here."""
    import os
    import stat
    import threading

    from tests.support.scan.scan_cli import run

    layout = oci_layout(tmp_path / "l", [debian_image(foreign_root, "arm64")])
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert run([str(layout), "--format", "json", "--output", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert json.loads(received[0])["findings"] == []


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("missing/report.json", "no directory"),
        (".", "is a directory"),
    ],
)
def test_an_output_it_cannot_write_is_refused_before_the_scan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, message: str
) -> None:
    from tests.support.scan.scan_cli import run

    out = tmp_path / where
    capsys.readouterr()
    assert run(["/bin/true", "--format", "json", "--output", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"execwatch scan: error: --output {out}: {message}")


def test_a_failed_write_is_exit_2_not_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk (/dev/full) as the last thing that goes wrong: not exit 1, which a CI
    job reads as findings, and not a traceback."""
    from tests.support.scan.scan_cli import run

    capsys.readouterr()
    assert run(["/bin/true", "--format", "sarif", "--output", "/dev/full"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "execwatch scan: error: --output /dev/full: No space left on device"
    ]
