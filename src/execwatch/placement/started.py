"""What a container starts: the programs whose verdict decides where its pod may go.

Kubernetes' rules: `command` replaces the image's Entrypoint and drops its Cmd, `args`
replaces Cmd. A leading `sh -c SCRIPT` starts the shell and then the script's first word,
when that word is a plain command. The scan follows each program through `#!` and `env`
to its loader and libraries.
"""

from __future__ import annotations

import copy
import io
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SHELLS = frozenset({"sh", "bash", "ash", "dash", "ksh", "mksh", "zsh"})
# A first word that is not a program on PATH: the script's own logic, not a binary.
# fmt: off
SHELL_WORDS = frozenset({
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "while", "until", "do",
    "done", "in", "function", "select", "time", "{", "}", "(", ")", "!", "[", "[[", ".",
    ":", "source", "cd", "set", "unset", "export", "readonly", "eval", "exec", "trap",
    "shift", "wait", "true", "false", "echo", "printf", "test", "read", "local", "return",
    "exit", "ulimit", "umask", "alias", "command", "type",
})
# fmt: on
MAX_SCRIPT_CHARS = 4 << 10  # of a `sh -c` script, lexed for its first command
MAX_SCRIPT_WORDS = 64  # assignments and `exec` before the command, and the command
PLAIN_WORD = re.compile(r"[A-Za-z0-9_./+,:@%-]+")
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class Unresolved(ValueError):
    """The program cannot be told without running the pod (a $(VAR) with no literal value)."""


@dataclass(frozen=True)
class Started:
    """The argv lists whose programs the container starts, first the one the runtime execs."""

    argvs: tuple[tuple[str, ...], ...]
    env: tuple[tuple[str, str], ...]  # the container's literal env, over the image's
    workdir: str | None

    def configs(self, image_config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One image config per program: that program as the Entrypoint, no Cmd, the
        container's env and working directory, so that the scan follows exactly it."""
        out = []
        for argv in self.argvs:
            doc = copy.deepcopy(dict(image_config))
            cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
            assert isinstance(cfg, dict)
            env = dict(_pairs(cfg.get("Env")))
            env.update(self.env)
            cfg.update(Entrypoint=list(argv), Cmd=None, Env=[f"{k}={v}" for k, v in env.items()])
            if self.workdir:
                cfg["WorkingDir"] = self.workdir
            doc["config"] = cfg
            out.append(doc)
        return out


def started(container: Mapping[str, Any], image_config: Mapping[str, Any]) -> Started:
    """What `container` starts on an image with `image_config` (an OCI image config)."""
    cfg = image_config.get("config") if isinstance(image_config.get("config"), dict) else {}
    assert isinstance(cfg, Mapping)
    env = _literal_env(container)
    argv = _expand(effective_argv(container, cfg), env)
    if not argv:
        raise Unresolved("neither the pod nor the image says what the container starts")
    argvs = [tuple(argv)]
    word = shell_command(argv)
    if word is not None:
        argvs.append((_expand([word], env)[0],))
    workdir = str(container.get("workingDir") or "") or None
    return Started(tuple(argvs), tuple(env.items()), workdir)


def effective_argv(container: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    command, args = container.get("command"), container.get("args")
    entrypoint, cmd = _strings(cfg.get("Entrypoint")), _strings(cfg.get("Cmd"))
    if command:
        return [*_strings(command), *_strings(args)]
    return [*entrypoint, *(_strings(args) if args else cmd)]


def shell_command(argv: Sequence[str]) -> str | None:
    """The first program of `sh -c SCRIPT`, when the script begins with a plain command."""
    if len(argv) < 3 or posixpath.basename(argv[0]) not in SHELLS:
        return None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and "c" not in argv[i]:
        i += 1
    if i + 1 >= len(argv) or not re.fullmatch(r"-[a-z]*c[a-z]*", argv[i]):
        return None
    words = _first_words(argv[i + 1])
    while words and (words[0] == "exec" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0])):
        words = words[1:]
    if not words or words[0] in SHELL_WORDS or not PLAIN_WORD.fullmatch(words[0]):
        return None
    return words[0]


def _first_words(script: str) -> list[str]:
    """The first words of a script, as `shlex.split(comments=True)` makes them, lexed from
    its first MAX_SCRIPT_CHARS only and no further than MAX_SCRIPT_WORDS: what decides is
    the first command, and a megabyte of script would otherwise cost a second of lexing.
    A word that runs into the cut is left out; a quote left open is no script."""
    text = script[:MAX_SCRIPT_CHARS]
    cut = len(script) > len(text)
    stream = io.StringIO(text)
    lexer = shlex.shlex(stream, posix=True)
    lexer.whitespace_split = True
    words: list[str] = []
    try:
        for word in lexer:
            if cut and stream.tell() >= len(text):
                break
            words.append(word)
            if len(words) >= MAX_SCRIPT_WORDS:
                break
    except ValueError:
        return words if cut else []
    return words


def _expand(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """$(VAR) from the container's literal env, as the kubelet expands it; the program's
    own name must expand fully, an argument may stay as it is."""

    def one(match: re.Match[str]) -> str:
        return env.get(match.group(1), match.group(0))

    out = [VAR_REF.sub(one, a) for a in argv]
    if out and VAR_REF.search(out[0]):
        raise Unresolved(f"the program {out[0]!r} names a variable without a literal value")
    return out


def _literal_env(container: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if isinstance(item, Mapping) and "valueFrom" not in item and item.get("name"):
            env[str(item["name"])] = str(item.get("value") or "")
    return env


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _pairs(raw: object) -> list[tuple[str, str]]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, str) and "=" in item:
            key, value = item.split("=", 1)
            out.append((key, value))
    return out
