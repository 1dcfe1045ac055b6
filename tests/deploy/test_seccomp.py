"""The agent's own seccomp profile (agent.seccomp.type=Localhost): one file in two places,
an allow list that fails everything else with EPERM, and how the chart and the kustomize
component put it on the node. That the agent works under it and that it is in force, on a
real kubelet: tests/node/test_story_seccomp.py."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy.chart import (
    CHART,
    KUSTOMIZE,
    REPO,
    Doc,
    find,
    kustomize_docs,
    pod_spec,
    render,
)

PROFILE = REPO / "deploy" / "seccomp" / "execwatch-agent.json"
CHART_COPY = CHART / "files" / "seccomp-agent.json"
COMPONENT = KUSTOMIZE / "components" / "seccomp-localhost"
LOCALHOST = "agent.seccomp.type=Localhost"
X86_64 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
# The asm-generic table arm64's asm/unistd.h includes (linux-libc-dev).
GENERIC = Path("/usr/include/asm-generic/unistd.h")


def profile() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(PROFILE.read_text())
    return doc


def allowed() -> list[str]:
    (rule,) = profile()["syscalls"]
    assert rule["action"] == "SCMP_ACT_ALLOW"
    names: list[str] = rule["names"]
    return names


def syscall_names(header: Path) -> set[str]:
    return set(re.findall(r"#define __NR_([a-z0-9_]+)\s", header.read_text()))


def agent_pod(docs: list[Doc]) -> Doc:
    return pod_spec(find(docs, "DaemonSet", "execwatch-agent"))


def test_the_chart_ships_the_same_profile() -> None:
    assert CHART_COPY.read_bytes() == PROFILE.read_bytes()


def test_everything_outside_the_allow_list_fails_with_eperm() -> None:
    doc = profile()
    assert doc["defaultAction"] == "SCMP_ACT_ERRNO"
    assert doc["defaultErrnoRet"] == 1  # EPERM
    assert "architectures" not in doc  # the node's native one: 32-bit calls are refused
    names = allowed()
    assert names == sorted(set(names))


def test_every_name_is_a_syscall_of_x86_64_or_arm64() -> None:
    assert set(allowed()) <= syscall_names(X86_64) | syscall_names(GENERIC)


def test_the_calls_the_agent_is_built_on_are_allowed_and_dangerous_ones_are_not() -> None:
    names = set(allowed())
    # bpf and tracepoints; the task's root; diagnosis workers and their fd passing.
    assert {"bpf", "perf_event_open", "openat2", "clone", "sendmsg", "recvmsg"} <= names
    # The calls glibc on arm64 makes where x86_64 has a legacy one.
    assert {"faccessat", "dup3", "epoll_pwait", "ppoll", "readlinkat", "pipe2"} <= names
    # runc's own calls after it loads the filter are in the list (setuid, setgid, setgroups,
    # capset, chdir: a non-root agent has no no_new_privs, so runc loads it before it
    # switches user); without CAP_SETUID/CAP_SETGID they change nothing for the agent.
    refused = {"ptrace", "process_vm_readv", "mount", "umount2", "unshare", "setns", "chroot",
               "pivot_root", "init_module", "finit_module", "kexec_load", "keyctl", "add_key",
               "symlink", "symlinkat", "io_uring_setup", "userfaultfd", "personality",
               "setresuid", "setreuid"}  # fmt: skip
    assert not names & refused


def test_the_default_is_the_runtimes_profile_and_no_init_container() -> None:
    docs = render()
    spec = agent_pod(docs)
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "seccompProfile" not in spec["containers"][0]["securityContext"]
    assert "initContainers" not in spec
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "seccomp" in d["metadata"]["name"]]


def test_localhost_puts_the_profile_on_the_agent_only_and_installs_it_first() -> None:
    docs = render(LOCALHOST)
    ds = find(docs, "DaemonSet", "execwatch-agent")
    spec = pod_spec(ds)
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (agent,) = spec["containers"]
    assert agent["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "execwatch-agent.json",
    }
    (init,) = spec["initContainers"]
    ctx = init["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"]} and not ctx["allowPrivilegeEscalation"]
    assert ctx["readOnlyRootFilesystem"] and "seccompProfile" not in ctx
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = [m for m in init["volumeMounts"] if not m.get("readOnly")]
    (host,) = [volumes[m["name"]]["hostPath"] for m in writable]
    assert host == {"path": "/var/lib/kubelet/seccomp", "type": "DirectoryOrCreate"}
    # The agent itself gets no new mount.
    assert "kubelet-seccomp" not in {m["name"] for m in agent["volumeMounts"]}

    cm = find(docs, "ConfigMap", "execwatch-agent-seccomp")
    assert cm["data"]["seccomp-agent.json"] == PROFILE.read_text()
    digest = hashlib.sha256(PROFILE.read_bytes()).hexdigest()[:16]
    assert ds["spec"]["template"]["metadata"]["annotations"]["execwatch.io/seccomp-profile"] == (
        digest
    )


def test_a_profile_installed_by_others_needs_no_init_container() -> None:
    docs = render(
        LOCALHOST,
        "agent.seccomp.installProfile=false",
        "agent.seccomp.localhostProfile=operator/execwatch/execwatch-agent.json",
    )
    spec = agent_pod(docs)
    assert "initContainers" not in spec
    assert spec["containers"][0]["securityContext"]["seccompProfile"]["localhostProfile"] == (
        "operator/execwatch/execwatch-agent.json"
    )
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "seccomp" in d["metadata"]["name"]]


def test_unconfined_is_still_possible() -> None:
    spec = agent_pod(render("agent.seccomp.type=Unconfined"))
    assert spec["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


@pytest.mark.parametrize(
    "value",
    [
        "agent.seccomp.type=localhost",
        "agent.seccomp.localhostProfile=/etc/x.json",
        "agent.seccomp.kubeletSeccompDir=seccomp",
    ],
)
def test_bad_values_are_refused_by_the_schema(value: str) -> None:
    with pytest.raises(RuntimeError, match="values don't meet the specifications"):
        render(value)


def strategic_merge(base: Any, patch: Any) -> Any:
    """kustomize's strategic merge for what the generated patches hold: maps recursively,
    lists of named items by name (volumeMounts by mountPath), other lists replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and base and isinstance(base[0], dict):
        key = "mountPath" if "mountPath" in base[0] else "name"
        if all(key in x for x in base + patch):
            merged = {x[key]: x for x in base}
            for x in patch:
                merged[x[key]] = strategic_merge(merged[x[key]], x) if x[key] in merged else x
            return list(merged.values())
    return patch


def test_the_kustomize_component_gives_the_charts_localhost_rendering() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    docs = kustomize_docs() + [
        d for r in component["resources"] for d in yaml.safe_load_all((COMPONENT / r).read_text())
    ]
    for p in component["patches"]:
        for patch in yaml.safe_load_all((COMPONENT / p["path"]).read_text()):
            target = find(docs, patch["kind"], patch["metadata"]["name"])
            docs[docs.index(target)] = strategic_merge(target, patch)
    rendered = render("plainManifests=true", LOCALHOST)
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(docs, key=key) == sorted(rendered, key=key)
