"""`execwatch agent` / `execwatch handler` plug into any argparse parser (the top-level
`execwatch` command owns its parser and calls `add_parser`)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from execwatch.agent import cli as agent_cli
from execwatch.handler import cli as handler_cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="execwatch")
    sub = p.add_subparsers(dest="command", required=True)
    agent_cli.add_parser(sub)
    handler_cli.add_parser(sub)
    return p


def test_handler_flags_and_defaults() -> None:
    args = parser().parse_args(
        [
            "handler",
            "--kubeconfig",
            "/k",
            "--lease-duration",
            "4",
            "--renew-deadline",
            "3",
            "--retry-period",
            "0.5",
            "--pod-label-metric",
        ]
    )
    assert args.func is handler_cli.run_handler
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (4.0, 3.0, 0.5)
    assert args.pod_label_metric and not args.no_label_pods
    assert args.namespace == "execwatch" and args.identity
    assert args.metrics_address == ("0.0.0.0", 9090) and args.workers == 16
    assert not args.placement_feedback
    assert parser().parse_args(["handler", "--placement-feedback"]).placement_feedback


def test_agent_flags_and_defaults() -> None:
    args = parser().parse_args(["agent", "--node", "worker-1"])
    assert args.func is agent_cli.run_agent
    assert args.node == "worker-1" and args.pod_metadata == "runtime"
    assert (args.aggregation_window, args.rate, args.burst, args.spool_size) == (60, 20, 50, 2000)
    assert not hasattr(args, "aggregation_window_max")  # one window option


def test_every_replica_gets_its_own_lease_identity() -> None:
    # Two processes built from one pod template must not share a Lease identity.
    a = parser().parse_args(["handler"]).identity
    b = parser().parse_args(["handler"]).identity
    assert a and b and a != b


def test_metrics_address_defaults_to_every_address() -> None:
    assert parser().parse_args(["handler"]).metrics_address == ("0.0.0.0", 9090)


def test_agent_spool_defaults() -> None:
    args = parser().parse_args(["agent"])
    assert args.spool_dir == "/var/lib/execwatch" and args.spool_bytes == 32 << 20
    assert args.spool_owner


def run_agent(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kc.yaml"  # a server nobody answers at: credentials parse
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    argv = [sys.executable, "-m", "execwatch.cli", "agent", "--kubeconfig", str(kubeconfig)]
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60)


def test_agent_with_an_unusable_spool_directory_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = run_agent(
        tmp_path, "--spool-dir", str(tmp_path / "file" / "spool"), "--metrics-address", ":0"
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "spool" in done.stderr, done.stderr


def test_agent_with_a_busy_metrics_port_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_agent(tmp_path, "--metrics-address", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Address already in use" in done.stderr


def test_the_node_defaults_to_the_hostname_as_the_kubelet_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "Worker-A")
    assert parser().parse_args(["agent"]).node == "worker-a"
