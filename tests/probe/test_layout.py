"""probe/layout.py's one declaration of each bpf/execwatch.h struct must match what a C
compiler lays out and what the BPF object's BTF says; every record kind has a decoder."""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from execwatch.probe import events, layout
from execwatch.probe.libbpf import load_libbpf
from execwatch.probe.loader import (
    ObjectBtf,
    Probe,
    ProbeError,
    ProbeOptions,
    default_object_path,
    layout_mismatch,
)

HEADER_DIR = Path(__file__).resolve().parents[2] / "src/execwatch/bpf"


def c_layout(tmp_path: Path, struct: str, fields: list[str]) -> dict[str, int]:
    lines = [f'printf("sizeof %zu\\n", sizeof(struct {struct}));']
    lines += [f'printf("{f} %zu\\n", offsetof(struct {struct}, {f}));' for f in fields]
    return c_values(tmp_path, lines)


def c_values(tmp_path: Path, lines: list[str]) -> dict[str, int]:
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <linux/types.h>\n"
        '#include "execwatch.h"\nint main(void) {\n' + "\n".join(lines) + "\nreturn 0; }\n"
    )
    binary = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{HEADER_DIR}", "-o", binary, source], check=True)
    out = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def c_constants(tmp_path: Path, names: list[str]) -> dict[str, int]:
    return c_values(tmp_path, [f'printf("{n} %ld\\n", (long)({n}));' for n in names])


def py_layout(struct: type[ctypes.Structure]) -> dict[str, int]:
    """sizeof, then each field's offset by its C member path ("head.pid")."""
    return {"sizeof": ctypes.sizeof(struct)} | {f.path: f.offset for f in layout.fields(struct)}


def test_event_layout_matches_the_header(tmp_path: Path) -> None:
    expected = py_layout(layout.Event)
    assert c_layout(tmp_path, "ew_event", list(expected)[1:]) == expected
    assert layout.EXEC_FAILED.size == ctypes.sizeof(layout.Event)


def test_config_counter_and_fold_state_match_the_header(tmp_path: Path) -> None:
    for struct, name in layout.DECLARED:
        expected = py_layout(struct)
        assert c_layout(tmp_path, name, list(expected)[1:]) == expected


def test_fold_constants_match_the_header(tmp_path: Path) -> None:
    constants = {
        "EW_FOLD_NAME_LEN": layout.FOLD_NAME_LEN,
        "EW_FOLD_KEY_WORDS": layout.FOLD_KEY_WORDS,
        "EW_FOLD_SETS": layout.FOLD_SETS,
        "EW_FOLD_WAYS": layout.FOLD_WAYS,
    }
    assert c_constants(tmp_path, list(constants)) == constants


def test_death_layout_matches_the_header(tmp_path: Path) -> None:
    expected = py_layout(layout.Death)
    assert c_layout(tmp_path, "ew_death", list(expected)[1:]) == expected
    assert layout.EARLY_DEATH.size == ctypes.sizeof(layout.Death)


def test_record_kinds_and_flags_match_the_header(tmp_path: Path) -> None:
    constants = {r.c_kind: r.kind for r in layout.RECORDS} | {
        "EW_ROOT_PATH_OK": layout.ROOT_PATH_OK,
        "EW_BASE_IN_ROOT": layout.BASE_IN_ROOT,
        "EW_EXE_PATH_OK": layout.EXE_PATH_OK,
        "EW_DEATH_SIGNAL": layout.DEATH_SIGNAL,
    }
    assert c_constants(tmp_path, list(constants)) == constants


def test_every_record_starts_with_its_kind_and_has_no_hidden_padding() -> None:
    for record in layout.RECORDS:
        assert layout.fields(record.ctype).__next__().path == "head.kind"
        assert record.struct.size == ctypes.sizeof(record.ctype)  # every byte is declared
        assert layout.KIND.unpack_from(record.pack())[0] == record.kind


def test_every_kind_of_record_has_one_entry_with_its_decoder_and_repeat_key() -> None:
    assert sorted(events.KINDS) == sorted(r.kind for r in layout.RECORDS)
    for kind, entry in events.KINDS.items():
        raw = entry.layout.pack(cgroup_id=77, mntns=5, root_ino=2, pid=9, comm=b"sh")
        assert events.decode_record(raw, 0.0).cgroup_id == 77
        assert events.repeat_key(raw)[:3] == (77, 5, 2)
        assert entry.layout.kind == kind


def test_a_death_never_repeats_a_failed_exec() -> None:
    failed = layout.EXEC_FAILED.pack(cgroup_id=7, err=8)
    signal = layout.EARLY_DEATH.pack(cgroup_id=7, signal=11, cause=layout.DEATH_SIGNAL)
    loader_exit = layout.EARLY_DEATH.pack(cgroup_id=7, exit_code=127)
    keys = [events.repeat_key(raw) for raw in (failed, signal, loader_exit)]
    assert [(k.kind, k.status) for k in keys] == [(1, 8), (2, 11), (2, 127 << 8)]


def test_a_record_of_unknown_kind_is_refused_in_one_line() -> None:
    raw = bytearray(layout.EARLY_DEATH.pack())
    raw[:4] = (3).to_bytes(4, "little")
    for read in (events.repeat_key, lambda r: events.decode_record(r, 0.0)):
        with pytest.raises(events.UnknownRecord, match="unknown kind 3") as caught:
            read(bytes(raw))
        assert "\n" not in str(caught.value)
    with pytest.raises(events.UnknownRecord, match="unknown kind 1"):
        events.repeat_key(layout.EXEC_FAILED.pack()[:100])  # cut short


def test_a_leaf_first_exe_path_reads_root_first_and_a_cut_one_says_so() -> None:
    whole = layout.EARLY_DEATH.pack(exe_path=b"ls/bin/usr/", exe_flags=layout.EXE_PATH_OK)
    cut = layout.EARLY_DEATH.pack(exe_path=b"ls/bin/")
    assert events.decode_record(whole, 0.0).path == "/usr/bin/ls"
    assert events.decode_record(cut, 0.0).path == "…/bin/ls"


@pytest.fixture
def object_btf() -> Iterator[ObjectBtf]:
    lib = load_libbpf()
    obj = lib.bpf_object__open_file(str(default_object_path()).encode(), None)
    assert obj, f"cannot open {default_object_path()}: run `make bpf`"
    try:
        yield ObjectBtf.of(lib, obj)
    finally:
        lib.bpf_object__close(obj)


def test_the_shipped_object_has_every_declared_struct_and_kind(object_btf: ObjectBtf) -> None:
    assert layout_mismatch(object_btf) is None
    for struct, name in layout.DECLARED:
        found = object_btf.struct(name)
        assert found is not None, name
        size, flat = found
        assert size == ctypes.sizeof(struct)
        assert flat == [(f.path, f.offset, f.size) for f in layout.fields(struct)]
    assert object_btf.enum("ew_kind") == {r.c_kind: r.kind for r in layout.RECORDS}


def bpf_object_from(tmp_path: Path, header: str) -> Path:
    """The shipped BPF source built against another execwatch.h."""
    (tmp_path / "execwatch.h").write_text(header)
    for name in ("execwatch.bpf.c", "compat.bpf.h"):
        (tmp_path / name).write_text((HEADER_DIR / name).read_text())
    arch = {"x86_64": "x86", "aarch64": "arm64"}[os.uname().machine]
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True)
    obj = tmp_path / "execwatch.bpf.o"
    subprocess.run(
        ["clang", "-g", "-O2", "-target", "bpf", f"-D__TARGET_ARCH_{arch}",
         f"-I/usr/include/{multiarch.stdout.strip()}", f"-I{tmp_path}",
         "-c", tmp_path / "execwatch.bpf.c", "-o", obj],
        check=True,
    )  # fmt: skip
    return obj


def test_an_object_built_from_another_layout_is_refused_at_load(tmp_path: Path) -> None:
    header = (HEADER_DIR / "execwatch.h").read_text()
    moved = "\t__s32 dirfd;          /* execveat only */\n"
    swapped = header.replace(
        "\t__s32 err;            /* positive errno */\n" + moved, moved + "\t__s32 err;\n"
    )
    assert swapped != header
    with (
        pytest.raises(ProbeError) as caught,
        Probe(ProbeOptions(object_path=bpf_object_from(tmp_path, swapped))),
    ):
        pass
    message = str(caught.value)
    assert "struct ew_event" in message and "err" in message and "rebuild it" in message
    assert "\n" not in message
