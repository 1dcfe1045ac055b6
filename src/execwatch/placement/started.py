"""What a container starts: the programs whose verdict decides where its pod may go.

Kubernetes' rules: `command` replaces the image's Entrypoint and drops its Cmd, `args`
replaces Cmd. A leading `sh -c SCRIPT` starts the shell and then the script's first word,
when that word is a plain command. The scan follows each program through `#!` and `env`
to its loader and libraries.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from execwatch.scan.shell import shell_command

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
