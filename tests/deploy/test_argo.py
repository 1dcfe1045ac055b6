"""Argo Rollouts AnalysisTemplates (deploy/argo): their queries, as written in the YAML,
fail a canary when a binary in its pods fails to start, and only then.

The main test runs the real chain: a real exec failure of an arm64 binary on this host,
caught and diagnosed by the real BPF probe, published as an ExecFailure by the real
publisher (agent credentials) into a real kube-apiserver, handled by a real handler
process (handler credentials) that serves execwatch_exec_failures_total, scraped by a
real Prometheus; the template's query is evaluated through Prometheus' HTTP API. One
step is stood in for: attribution to the pod (proven in tests/attribution) is given, since
the failing process is not in a kubelet-managed container here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from execwatch.node.stack import StackOptions
from execwatch.pipeline import PipelineOptions
from execwatch.record import Attribution, AttributionStatus, ExecFailure, Reason
from tests.support.deploy.chart import REPO, Doc
from tests.support.kube.apiserver import KubeCluster, ensure_namespace
from tests.support.kube.execwatch_process import ExecwatchProcess
from tests.support.monitoring.prometheus_server import Prometheus
from tests.support.node.stack_runner import node_stack

ARGO = REPO / "deploy" / "argo"
HELLO_ARM64 = REPO / ".cache" / "foreign" / "arm64" / "root" / "usr" / "bin" / "hello"
NODE = "arm-node-1"
NS = "shop"
ROLLOUT = "oberon-runner"
CANARY, STABLE = "6c9f7d5b4", "5b8d7c6f9"
ARGS = {"namespace": NS, "rollout-name": ROLLOUT, "canary-hash": CANARY}
CONDITION = re.compile(r"^result\[0\] (==|!=|>=|<=|>|<) (\d+(?:\.\d+)?)$")


def template(name: str) -> Doc:
    doc: Doc = yaml.safe_load((ARGO / f"{name}.yaml").read_text())
    return doc


def only_metric(tmpl: Doc) -> Doc:
    (metric,) = tmpl["spec"]["metrics"]
    result: Doc = metric
    return result


def query_of(tmpl: Doc, **overrides: str) -> str:
    """The metric's query with {{args.X}} substituted as Argo does (defaults included)."""
    values = {a["name"]: a.get("value") for a in tmpl["spec"]["args"]}
    values.update(ARGS)
    values.update(overrides)
    text: str = only_metric(tmpl)["provider"]["prometheus"]["query"]

    def sub(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        assert value is not None, f"arg {m.group(1)} has no value"
        return str(value)

    text = re.sub(r"\{\{\s*args\.([\w-]+)\s*\}\}", sub, text)
    assert "{{" not in text
    return text


def holds(condition: str, result: list[float]) -> bool:
    """Argo's condition for the expressions the templates use: `result[0] <op> <number>`."""
    m = CONDITION.match(condition.strip())
    assert m, f"unsupported condition {condition!r}"
    op, n = m.group(1), float(m.group(2))
    v = result[0]
    return {"==": v == n, "!=": v != n, ">=": v >= n, "<=": v <= n, ">": v > n, "<": v < n}[op]


@pytest.mark.parametrize("name", ["execwatch-exec-failures", "pod-restart-analysis"])
def test_templates_declare_every_arg_they_use_and_fail_on_the_first_bad_measurement(
    name: str,
) -> None:
    tmpl = template(name)
    assert (tmpl["apiVersion"], tmpl["kind"]) == ("argoproj.io/v1alpha1", "AnalysisTemplate")
    declared = {a["name"] for a in tmpl["spec"]["args"]}
    used = set(re.findall(r"\{\{\s*args\.([\w-]+)\s*\}\}", yaml.safe_dump(tmpl["spec"]["metrics"])))
    assert used == declared
    metric = only_metric(tmpl)
    assert metric["failureLimit"] == 0
    assert holds(metric["failureCondition"], [1.0]) and not holds(metric["failureCondition"], [0.0])
    assert holds(metric["successCondition"], [0.0])
    assert query_of(tmpl).rstrip().endswith("or vector(0)"), "an empty result must read as 0"


def test_example_rollout_passes_every_required_arg() -> None:
    docs = [d for d in yaml.safe_load_all((ARGO / "rollout-example.yaml").read_text()) if d]
    (rollout,) = docs
    analysis = rollout["spec"]["strategy"]["canary"]["analysis"]
    passed = {a["name"] for a in analysis["args"]}
    for ref in analysis["templates"]:
        tmpl = template(ref["templateName"])
        required = {a["name"] for a in tmpl["spec"]["args"] if "value" not in a}
        assert required <= passed, ref
    hash_arg = next(a for a in analysis["args"] if a["name"] == "canary-hash")
    assert hash_arg["valueFrom"] == {"podTemplateHashValue": "Latest"}


# -- the queries on synthetic series, with promtool -----------------------------------------


def promtool_fires(
    tmp_path: Path, query: str, series: list[dict[str, str]], cases: list[tuple[str, bool]]
) -> None:
    """Wrap `(query) > 0` (the failure condition) in an alert and check when it fires."""
    tool = shutil.which("promtool")
    assert tool, "promtool missing: apt-get install prometheus"
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {"name": "argo", "rules": [{"alert": "CanaryFails", "expr": f"({query}) > 0"}]}
                ]
            }
        )
    )
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "15s",
                "tests": [
                    {
                        "interval": "15s",
                        "input_series": series,
                        "alert_rule_test": [
                            {
                                "eval_time": t,
                                "alertname": "CanaryFails",
                                "exp_alerts": [{"exp_labels": {}}] if fires else [],
                            }
                            for t, fires in cases
                        ],
                    }
                ],
            }
        )
    )
    out = subprocess.run(
        [tool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_exec_failure_query_counts_only_new_failures_of_the_canary(tmp_path: Path) -> None:
    def failures(workload: str, reason: str = "ForeignArchitecture") -> str:
        return (
            'execwatch_exec_failures_total{job="execwatch-handler",instance="h",node="n",'
            f'node_arch="arm64",binary_arch="amd64",reason="{reason}",container="c",'
            f'namespace="shop",workload="{workload}"}}'
        )

    promtool_fires(
        tmp_path,
        query_of(template("execwatch-exec-failures")),
        [
            # The stable ReplicaSet has failed for long: not the canary's business.
            {"series": failures(f"{ROLLOUT}-{STABLE}"), "values": "5+1x80"},
            # PATH noise in the canary does not count.
            {"series": failures(f"{ROLLOUT}-{CANARY}", "NotFound"), "values": "_x4 1+1x76"},
            # The canary's first failure at 5m: a new series starting at 1.
            {"series": failures(f"{ROLLOUT}-{CANARY}"), "values": "_x20 1x60"},
        ],
        [("4m", False), ("5m15s", True), ("9m", True), ("11m", False)],
    )


def test_exec_failure_query_fails_a_canary_whose_entrypoint_nothing_retried(
    tmp_path: Path,
) -> None:
    """MissingShebang (the runtime gave up on a file with no #!) fails the analysis; the
    benign NoShebang (a shell ran such a file) does not."""

    def failures(reason: str) -> str:
        return (
            'execwatch_exec_failures_total{job="execwatch-handler",instance="h",node="n",'
            f'node_arch="amd64",binary_arch="",reason="{reason}",container="c",'
            f'namespace="shop",workload="{ROLLOUT}-{CANARY}"}}'
        )

    promtool_fires(
        tmp_path,
        query_of(template("execwatch-exec-failures")),
        [
            {"series": failures("NoShebang"), "values": "_x4 1+1x76"},
            {"series": failures("MissingShebang"), "values": "_x20 1+1x60"},
        ],
        [("4m", False), ("5m15s", True)],
    )


def test_restart_query_counts_restarts_of_canary_pods_only(tmp_path: Path) -> None:
    def restarts(pod: str) -> str:
        return (
            'kube_pod_container_status_restarts_total{job="kube-state-metrics",'
            f'namespace="shop",container="oberon-runner",uid="u",pod="{pod}"}}'
        )

    promtool_fires(
        tmp_path,
        query_of(template("pod-restart-analysis")),
        [
            {"series": restarts(f"{ROLLOUT}-{STABLE}-aaaaa"), "values": "0+1x40"},
            {"series": restarts(f"{ROLLOUT}-{CANARY}-bbbbb"), "values": "0x12 1x28"},
        ],
        [("2m", False), ("3m15s", True), ("4m45s", True), ("6m", False)],
    )


# -- the real chain ----------------------------------------------------------------------------


class Handler(ExecwatchProcess):
    """`execwatch handler` as its own process, with the handler ServiceAccount's token."""

    def __init__(self, kube: KubeCluster, workdir: Path) -> None:
        token = kube.service_account_token("execwatch", "execwatch-handler")
        kubeconfig = kube.kubeconfig(token, workdir / "handler.kubeconfig")
        super().__init__(
            [
                "handler",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                "execwatch",
                "--identity",
                "argo-test",
                "--lease-duration",
                "4",
                "--renew-deadline",
                "3",
                "--retry-period",
                "1",
            ],
            workdir / "handler.log",
            start_new_session=True,
        )

    def wait_leading(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("handler exited:\n" + self.log.read_text())
            try:
                if "execwatch_handler_leader 1.0" in self.metrics_text():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("handler never led:\n" + self.log.read_text())


@pytest.fixture
def handler(kube: KubeCluster, tmp_path: Path) -> Iterator[Handler]:
    h = Handler(kube, tmp_path)
    try:
        h.wait_leading()
        yield h
    finally:
        h.stop()


@pytest.fixture
def prometheus(handler: Handler, tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path / "prometheus", {"execwatch-handler": [handler.address]})
    try:
        yield prom
    finally:
        prom.stop()


def create_rollout_pod(api: client.ApiClient, pod_hash: str) -> client.V1Pod:
    """A Pod as Argo Rollouts' ReplicaSet `<rollout>-<hash>` would create it, on NODE."""
    ensure_namespace(api, NS)
    rs = f"{ROLLOUT}-{pod_hash}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"{rs}-{uuid.uuid4().hex[:5]}",
            namespace=NS,
            labels={"app": ROLLOUT, "rollouts-pod-template-hash": pod_hash},
            owner_references=[
                client.V1OwnerReference(
                    api_version="apps/v1",
                    kind="ReplicaSet",
                    name=rs,
                    uid=str(uuid.uuid4()),
                    controller=True,
                )
            ],
        ),
        spec=client.V1PodSpec(
            node_name=NODE,
            containers=[
                client.V1Container(name=ROLLOUT, image=f"registry.internal/{ROLLOUT}:{pod_hash}")
            ],
        ),
    )
    created: client.V1Pod = client.CoreV1Api(api).create_namespaced_pod(NS, pod)
    return created


def real_foreign_exec_failure() -> ExecFailure:
    """Exec an arm64 binary on this (non-arm64) host; the probe's diagnosed record of it."""
    if not HELLO_ARM64.exists():
        pytest.fail(f"{HELLO_ARM64} missing: run dev/fetch-foreign.sh", pytrace=False)
    with node_stack(StackOptions(pipeline=PipelineOptions(window=0.05))) as running:
        err = _exec_in_child(str(HELLO_ARM64))
        assert err == 8, f"expected ENOEXEC from the arm64 binary, got errno {err}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            running.probe.poll(50)
            running.pipeline.flush()
            for r in running.records:
                if r.event.path == str(HELLO_ARM64):
                    return r
    raise AssertionError("the probe never reported the failed exec")


def _exec_in_child(path: str) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.execv(path, [path])
        except OSError as exc:
            os.write(w, bytes([exc.errno or 0]))
        os._exit(0)
    os.close(w)
    code = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    return code[0] if code else 0


def in_pod(failure: ExecFailure, pod: client.V1Pod) -> ExecFailure:
    """The attribution the agent makes for a process of this pod's container."""
    owner = pod.metadata.owner_references[0]
    return dataclasses.replace(
        failure,
        attribution=Attribution(
            status=AttributionStatus.ATTRIBUTED,
            runtime="containerd",
            container_id=uuid.uuid4().hex * 2,
            pod_uid=pod.metadata.uid,
            namespace=pod.metadata.namespace,
            pod=pod.metadata.name,
            container=ROLLOUT,
            image=pod.spec.containers[0].image,
            workload_kind=owner.kind,
            workload=owner.name,
        ),
    )


def publish(kube: KubeCluster, failures: list[ExecFailure]) -> None:
    """The agent's publisher, with the agent ServiceAccount's token."""
    with kube.rest(kube.node_token("execwatch", "execwatch-agent", NODE)) as api:
        publisher = Publisher(
            PublisherConfig(node=NODE, namespace="execwatch"), RecordApi(api, "execwatch")
        )
        publisher.start()
        for f in failures:
            publisher.submit(f)
        publisher.stop(flush_timeout=10)
        assert publisher.spooled() == 0, "records left unsent"


def test_canary_analysis_fails_after_a_real_exec_failure_and_not_before(
    kube: KubeCluster,
    admin: client.ApiClient,
    handler: Handler,
    prometheus: Prometheus,
) -> None:
    tmpl = template("execwatch-exec-failures")
    metric = only_metric(tmpl)
    query = query_of(tmpl)
    canary = create_rollout_pod(admin, CANARY)
    stable = create_rollout_pod(admin, STABLE)
    prometheus.wait_until('up{job="execwatch-handler"}', lambda v: v == [1.0])

    failure = real_foreign_exec_failure()
    assert failure.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
    assert failure.diagnosis.binary_arch == "arm64"

    # The stable ReplicaSet failing does not fail the canary.
    publish(kube, [in_pod(failure, stable)])
    prometheus.wait_until(
        f'sum(execwatch_exec_failures_total{{workload="{ROLLOUT}-{STABLE}"}})',
        lambda v: v and v[0] >= 1,
    )
    before = prometheus.values(query)
    assert before == [0.0]
    assert not holds(metric["failureCondition"], before)
    assert holds(metric["successCondition"], before)

    publish(kube, [in_pod(failure, canary)])
    after = prometheus.wait_until(query, lambda v: v and v[0] > 0)
    assert holds(metric["failureCondition"], after)
    assert not holds(metric["successCondition"], after)

    # What Prometheus saw is what the handler exported for the canary's ReplicaSet.
    series = prometheus.query(f'execwatch_exec_failures_total{{workload="{ROLLOUT}-{CANARY}"}}')
    (s,) = series["result"]
    want: dict[str, Any] = {
        "namespace": NS,
        "container": ROLLOUT,
        "node": NODE,
        "reason": "ForeignArchitecture",
        "binary_arch": "arm64",
    }
    assert want.items() <= s["metric"].items()
    labelled = client.CoreV1Api(admin).read_namespaced_pod(canary.metadata.name, NS)
    assert labelled.metadata.labels.get("execwatch.io/exec-failure")
