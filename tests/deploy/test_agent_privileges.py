"""What the agent's uid is worth, proven in runc containers built like the image
(tests/deploy/test_image.py) with the DaemonSet's capabilities and host PID namespace.

- As the chart runs it by default (uid 0, only its capabilities, no_new_privs), it could
  still write a root-owned host file through /proc/PID/root: uid 0 owns it.
- With agent.runAsNonRoot=true (uid 65532, the same capabilities in its bounding set only,
  as Kubernetes gives them: there is no ambient field), the agent works when its
  interpreter carries them as *permitted* file capabilities and no_new_privs is off
  (allowPrivilegeEscalation: true): it loads the probe and diagnoses a host exec, and it
  cannot write that file.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_image import (
    CAP_BITS,
    HELLO_ARM64,
    VENV_IN_IMAGE,
    Image,
    agent_caps,
    trace_during_foreign_execs,
)
from tests.support.deploy.chart import find, pod_spec, render

VFS_CAP_REVISION_2 = 0x02000000  # security.capability xattr, no effective bit


def chart_context(*sets: str) -> dict[str, object]:
    """The agent container's security context as the chart renders it, as runc terms."""
    agent = pod_spec(find(render(*sets), "DaemonSet"))
    ctx = agent["containers"][0]["securityContext"]
    assert ctx["capabilities"]["drop"] == ["ALL"] and ctx["privileged"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    return {
        "uid": ctx["runAsUser"],
        "caps": agent_caps(),  # the same add list, less what this sandbox cannot grant
        "no_new_privs": not ctx["allowPrivilegeEscalation"],
    }


def grant_permitted(binary: Path, caps: list[str]) -> None:
    """What `setcap cap_bpf,...+p` writes: permitted only, so an exec under a narrower
    bounding set (the handler's: none) still works, and the program raises them itself."""
    mask = sum(1 << CAP_BITS[c] for c in caps)
    xattr = struct.pack("<IIIII", VFS_CAP_REVISION_2, mask & 0xFFFFFFFF, 0, mask >> 32, 0)
    os.setxattr(binary, "security.capability", xattr)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.geteuid() != 0:
        pytest.fail("the image tests start runc containers: run as root", pytrace=False)
    image = Image(tmp_path_factory.mktemp("image-caps"))
    # The image's interpreter, with the agent's capabilities as file capabilities.
    venv_bin = image.root / VENV_IN_IMAGE.lstrip("/") / "bin"
    interpreter = venv_bin / f"python{sys.version_info.major}.{sys.version_info.minor}"
    real = interpreter.resolve()
    interpreter.unlink()
    shutil.copy2(real, interpreter)
    grant_permitted(interpreter, agent_caps())
    yield image


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root-owned, owner-writable host file, like most of /etc."""
    path = tmp_path / "root-owned.conf"
    path.write_text("original\n")
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    return path


def write_through_proc(image: Image, victim: Path, **kw: Any) -> str:
    target = f"/proc/{os.getpid()}/root{victim}"
    code = (  # with every capability the agent holds raised, as the agent raises them
        "from execwatch.probe import caps; caps.raise_permitted(); "
        f"print('CAPS', hex(caps.effective())); "
        f"open({target!r}, 'a').write('written by the agent\\n'); print('WROTE')"
    )
    out = image.run(["python", "-c", code], host_pid=True, agent_mounts=True, **kw)
    return out.stdout + out.stderr


def test_uid_0_with_only_the_daemonsets_capabilities_can_still_write_root_owned_host_files(
    image: Image, victim: Path
) -> None:
    out = write_through_proc(image, victim, **chart_context())
    assert "WROTE" in out
    assert victim.read_text() == "original\nwritten by the agent\n"


def test_a_non_root_agent_with_file_capabilities_diagnoses_and_cannot_write(
    image: Image, victim: Path
) -> None:
    nonroot = chart_context("agent.runAsNonRoot=true")
    assert nonroot["uid"] == 65532 and nonroot["no_new_privs"] is False
    out = write_through_proc(image, victim, **nonroot)
    mask = sum(1 << CAP_BITS[c] for c in agent_caps())
    assert f"CAPS {hex(mask)}" in out  # it holds the agent's capabilities, and yet:
    assert "Permission denied" in out and "WROTE" not in out
    assert victim.read_text() == "original\n"

    run = trace_during_foreign_execs(image, **nonroot)
    assert run.returncode == 0, run.stderr
    mine = [json.loads(x) for x in run.stdout.splitlines() if str(HELLO_ARM64) in x]
    assert mine, run.stderr[-2000:]
    assert mine[0]["reason"] == "ForeignArchitecture"


def test_without_file_capabilities_a_non_root_agent_is_refused_in_one_line(
    image: Image,
) -> None:
    """no_new_privs (allowPrivilegeEscalation: false) ignores file capabilities."""
    context = {**chart_context("agent.runAsNonRoot=true"), "no_new_privs": True}
    run = image.run(
        ["execwatch", "trace", "--duration", "1", "--no-attribution"],
        host_pid=True,
        agent_mounts=True,
        **context,  # type: ignore[arg-type]
    )
    assert run.returncode == 2
    assert "needs CAP_BPF and CAP_PERFMON" in run.stderr
