"""The Python mirror of bpf/execwatch.h must match what a C compiler lays out."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from execwatch.probe import layout

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
    names = [f[0] for f in struct._fields_]
    return {"sizeof": ctypes.sizeof(struct)} | {n: getattr(struct, n).offset for n in names}


def test_event_layout_matches_the_header(tmp_path: Path) -> None:
    expected = py_layout(layout.Event)
    assert c_layout(tmp_path, "ew_event", list(expected)[1:]) == expected
    assert layout.EVENT_STRUCT.size == ctypes.sizeof(layout.Event)


def test_config_counter_and_fold_state_match_the_header(tmp_path: Path) -> None:
    for struct, name in (
        (layout.Config, "ew_config"),
        (layout.CountKey, "ew_count_key"),
        (layout.FoldSlot, "ew_fold_slot"),
        (layout.FoldSet, "ew_fold_set"),
        (layout.FoldName, "ew_fold_name"),
        (layout.FoldClock, "ew_fold_clock"),
    ):
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
    assert layout.DEATH_STRUCT.size == ctypes.sizeof(layout.Death)
