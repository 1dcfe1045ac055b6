"""What a container starts, by Kubernetes' rules for command and args over the image's
Entrypoint and Cmd, and through a leading `sh -c`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from execwatch.placement.started import Unresolved, started
from execwatch.scan.shell import shell_command

IMAGE = {"config": {"Entrypoint": ["/entry"], "Cmd": ["--default"], "Env": ["PATH=/bin"]}}


@pytest.mark.parametrize(
    ("container", "argv"),
    [
        ({}, ("/entry", "--default")),
        ({"args": ["--mine"]}, ("/entry", "--mine")),
        ({"command": ["/tool"]}, ("/tool",)),
        ({"command": ["/tool"], "args": ["-v"]}, ("/tool", "-v")),
        ({"command": ["$(BIN)"], "env": [{"name": "BIN", "value": "/opt/bin"}]}, ("/opt/bin",)),
    ],
)
def test_command_replaces_the_entrypoint_and_args_the_cmd(
    container: dict[str, Any], argv: tuple[str, ...]
) -> None:
    assert started(container, IMAGE).argvs == (argv,)


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["sh", "-c", "exec /app/server --port 80"], "/app/server"),
        (["/bin/bash", "-ec", "LOG=1 tool run"], "tool"),
        (["sh", "-e", "-c", "python3 app.py && echo done"], "python3"),
        (["sh", "-c", "if true; then x; fi"], None),
        (["sh", "-c", "$BIN --x"], None),
        (["sh", "-c", "cd /app; ./run"], None),
        (["sh", "script.sh"], None),
        (["/app/server", "-c", "conf"], None),
    ],
)
def test_the_first_word_of_an_sh_c_script_when_it_is_a_plain_command(
    argv: list[str], word: str | None
) -> None:
    assert shell_command(argv) == word


def test_a_megabytes_long_sh_c_script_is_lexed_only_as_far_as_its_first_command() -> None:
    """Issue 34: a 1.4 MB `sh -c` script cost 0.69 s of shlex under the GIL, per
    container and architecture. Only its first MAX_SCRIPT_CHARS are lexed: the first
    command is found in a few milliseconds of CPU, whatever follows it; a word that runs
    into the cut is no program."""
    script = "exec /app/run " + "--flag value " * ((2 << 20) // 13)  # 2 MiB of words
    cpu = time.process_time()
    assert shell_command(["sh", "-c", script]) == "/app/run"
    assert time.process_time() - cpu < 0.1
    long = "x" * (64 << 10)
    assert shell_command(["sh", "-c", f"exec /app/run --data '{long}'"]) == "/app/run"
    assert shell_command(["sh", "-c", f"LONG={long} /app/run"]) is None
    assert shell_command(["sh", "-c", f"/app/{long}"]) is None


def test_each_program_becomes_the_entrypoint_of_one_scan_with_the_pods_env() -> None:
    container = {
        "command": ["sh", "-c", "exec tool"],
        "env": [{"name": "PATH", "value": "/opt/bin"}, {"name": "S", "valueFrom": {}}],
        "workingDir": "/work",
    }

    configs = started(container, IMAGE).configs(IMAGE)

    assert [c["config"]["Entrypoint"] for c in configs] == [["sh", "-c", "exec tool"], ["tool"]]
    assert all(c["config"]["Cmd"] is None for c in configs)
    assert configs[0]["config"]["Env"] == ["PATH=/opt/bin"]
    assert configs[0]["config"]["WorkingDir"] == "/work"
    assert IMAGE["config"]["Entrypoint"] == ["/entry"], "the image's own config is untouched"


def test_a_program_named_by_a_variable_without_a_literal_value_is_unresolved() -> None:
    with pytest.raises(Unresolved):
        started({"command": ["$(BIN)"], "env": [{"name": "BIN", "valueFrom": {}}]}, IMAGE)
