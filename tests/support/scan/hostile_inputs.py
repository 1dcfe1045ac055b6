"""Hostile scan inputs, generated: symlink chains, ld.so.conf include trees, OCI JSON bombs,
DT_NEEDED loops and 2 GB sparse files. Shared by tests/scan/test_hostile_corpus.py and
benchmarks/parser_bench.py; each builder writes its input under `root` and returns the
scan target.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from execwatch.runnable.fs import Node
from execwatch.runnable.linker import Linker
from execwatch.runnable.memory import MemoryFS
from tests.support.binfmt.elfbuild import ElfSpec, build_elf
from tests.support.binfmt.hostile_elf import sparse_elf
from tests.support.images.imagebuild import Entry, Image, file, oci_layout, symlink

LOADER = "/lib64/ld-linux-x86-64.so.2"


def ld_so_conf_dirs(files: dict[str, bytes]) -> list[str]:
    """The directories the linker reads from these configuration files (path -> content)."""
    fs = MemoryFS()
    for path, text in files.items():
        fs.put(path, Node("file", 0o644, len(text), text=text))
    return Linker(fs, {})._ld_so_conf()


def include_tree(files: int, dirs_per_file: int) -> dict[str, bytes]:
    """/etc/ld.so.conf including `files` files that each include all others and list dirs."""
    out = {"/etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n"}
    for i in range(files):
        lines = ["include /etc/ld.so.conf.d/*.conf"]
        lines += [f"/opt/{i}/{j}" for j in range(dirs_per_file)]
        out[f"/etc/ld.so.conf.d/{i:04}.conf"] = "\n".join(lines).encode()
    return out


def _elf(**kwargs: object) -> bytes:
    return build_elf(ElfSpec(**kwargs)).data  # type: ignore[arg-type]


def _glibc_base() -> list[Entry]:
    """A loader (an ELF with no interpreter) where glibc's loader lives: enough to resolve."""
    return [file(LOADER[1:], _elf(interpreter=None, soname="ld-linux-x86-64.so.2"))]


def needed_loop(root: Path) -> Path:
    """An executable needing liba, which needs libb, which needs liba and itself."""
    libs = [
        file("usr/lib/liba.so", _elf(interpreter=None, soname="liba.so", needed=["libb.so"])),
        file(
            "usr/lib/libb.so",
            _elf(interpreter=None, soname="libb.so", needed=["liba.so", "libb.so"]),
        ),
        file("bin/app", _elf(elf_type=2, needed=["liba.so", "liba.so"])),
    ]
    return oci_layout(root, [Image([_glibc_base() + libs], entrypoint=["/bin/app"])])


def symlink_chain(root: Path, links: int = 40, steps: int = 800) -> Path:
    """The entrypoint reached through `links` symlinks, each a target of `steps` x `x/../`.

    The default, 4 KiB targets, walks 64,000 path components.
    """
    steps_text = "x/../" * steps
    entries = [file("x/.keep", b"", 0o644), file("bin/real", b"#!/bin/real\n")]
    for i in range(links):
        target = f"/{steps_text}l{i + 1}" if i + 1 < links else f"/{steps_text}bin/real"
        entries.append(symlink(f"l{i}", target))
    return oci_layout(root, [Image([entries], entrypoint=["/l0"])])


def include_bomb(root: Path) -> Path:
    """An image whose ld.so.conf includes 300 files of 50 directories each."""
    tree = include_tree(300, 50)
    entries = _glibc_base() + [file(p[1:], t, 0o644) for p, t in tree.items()]
    entries.append(file("bin/app", _elf(elf_type=2, needed=["libx.so"])))
    return oci_layout(root, [Image([entries], entrypoint=["/bin/app"])])


def _with_index(root: Path, index: bytes) -> Path:
    layout = oci_layout(root, [Image([[file("bin/sh", b"#!/bin/sh\n")]])])
    (layout / "index.json").write_bytes(index)
    return layout


def deep_json(root: Path) -> Path:
    """index.json nested 100,000 arrays deep (200 KB)."""
    return _with_index(root, b"[" * 100_000 + b"]" * 100_000)


def wide_json(root: Path) -> Path:
    """index.json with 1.9 million numbers in 3.8 MB: each one an object json.loads builds."""
    body = b"0," * 1_900_000
    return _with_index(root, b'{"manifests": [' + body + b"0]}")


def sparse_rootfs(root: Path) -> Path:
    """A root filesystem holding a 2 GB sparse ELF and a 2 GB sparse executable of zeros."""
    (root / "bin").mkdir(parents=True)
    sparse_elf(root / "bin/huge").chmod(0o755)
    with open(root / "bin/zeros", "wb") as f:
        f.truncate(2 << 30)
    (root / "bin/zeros").chmod(0o755)
    return root


CORPUS: dict[str, Callable[[Path], Path]] = {
    "DT_NEEDED-loop": needed_loop,
    "40-symlink-chain-4KiB-targets": symlink_chain,
    "ld.so.conf-300-includes": include_bomb,
    "index.json-100k-deep": deep_json,
    "index.json-1.9M-values": wide_json,
    "rootfs-2GB-sparse-files": sparse_rootfs,
}


def layer_json(doc: object) -> bytes:
    return json.dumps(doc).encode()
