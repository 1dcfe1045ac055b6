"""Printing records for people (one line each) and for programs (JSON lines)."""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from execwatch.record import Ended, ExecFailure, Reason
from execwatch.text import safe_text


def _safe(value: Any) -> Any:
    return safe_text(value) if isinstance(value, str) else value


def json_line(failure: ExecFailure) -> str:
    return json.dumps({k: _safe(v) for k, v in failure.to_json().items()}, ensure_ascii=False)


def human_line(failure: ExecFailure) -> str:
    e, d, a = failure.event, failure.diagnosis, failure.attribution
    stamp = time.strftime("%H:%M:%S", time.localtime(e.time)) + f".{int(e.time * 1000) % 1000:03d}"
    j = failure.to_json()
    parts = [stamp, j["errno"], str(d.reason), safe_text(e.path)]
    if d.binary_arch and d.reason is not Reason.FOREIGN_OS:  # its detail names OS and arch
        parts.append(f"({d.binary_arch} on {d.node_arch})")
    if d.interpreter:
        parts.append(f"interpreter={safe_text(d.interpreter)}")
    for key in ("library", "symbol", "version"):
        if j[key]:
            parts.append(f"{key}={safe_text(j[key])}")
    if isinstance(e, Ended) and e.age_ms is not None:
        parts.append(f"age={e.age_ms:.0f}ms")
    parts.append(
        f"pid={e.tgid} ppid={e.ppid} comm={safe_text(e.comm)} parent={safe_text(e.parent_comm)}"
    )
    parts.append(f"uid={e.uid}")
    if a.pod:
        pod = f"{a.namespace or ''}/{a.pod}"
        parts.append(f"pod={safe_text(pod)} container={safe_text(a.container or '')}")
    elif a.container_id:
        parts.extend(_engine_container(failure))
    if failure.count > 1:
        parts.append(f"x{failure.count} more")
    if d.detail:
        parts.append(f"— {safe_text(d.detail)}")
    return " ".join(parts)


def _engine_container(failure: ExecFailure) -> list[str]:
    """A Docker or Podman container: its id, and what its engine named."""
    a = failure.attribution
    cid = (a.container_id or "")[:12]
    if not a.container:
        return [f"container={cid}"]
    parts = [f"container={safe_text(a.container)} ({cid} {a.runtime or ''})".replace(" )", ")")]
    if a.image:
        parts.append(f"image={safe_text(a.image)}")
    if a.engine_pod:
        parts.append(f"engine_pod={safe_text(a.engine_pod)}")
    if a.compose_project or a.compose_service:
        compose = f"{a.compose_project or ''}/{a.compose_service or ''}"
        parts.append(f"compose={safe_text(compose)}")
    if a.engine_user:
        parts.append(f"user={safe_text(a.engine_user)}")
    return parts


class Printer:
    """The trace sink: writes and flushes one line per record."""

    def __init__(self, stream: TextIO, *, as_json: bool) -> None:
        self._stream = stream
        self._format = json_line if as_json else human_line

    def __call__(self, failure: ExecFailure) -> None:
        self._stream.write(self._format(failure) + "\n")
        self._stream.flush()
