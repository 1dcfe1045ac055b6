"""The first program of a container's `sh -c SCRIPT`: what the shell starts, when the
script begins with a plain command (placement decides by it, the scan checks it)."""

from __future__ import annotations

import io
import posixpath
import re
import shlex
from collections.abc import Sequence

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
