"""The rendered manifests against a real kube-apiserver (tests/kube): schema-valid with
strict field validation (server-side apply, dry run), and Pod Security as enforced by the
API server's own admission plugin."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tests.support.deploy.chart import Doc, find, kustomize_docs, pod_spec, render

# prometheus-operator and OpenShift kinds: no CRD for them in a bare API server. They are
# checked by tests/deploy/test_chart.py and (PrometheusRule) by promtool.
NOT_IN_A_BARE_API_SERVER = {"ServiceMonitor", "PrometheusRule", "SecurityContextConstraints"}

VALUE_SETS = {
    "defaults": (),
    "everything-on": (
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
        "openshift.scc.enabled=true",
    ),
    "no-cri-socket-all-caps-off": (
        "agent.criSocket=",
        "agent.capabilities.sysResource=false",
        "agent.capabilities.sysPtrace=false",
        "agent.capabilities.dacReadSearch=false",
    ),
    "seccomp-localhost": ("agent.seccomp.type=Localhost",),
    "handler-options": (
        "handler.replicas=3",
        "handler.podLabelMetric=true",
        "handler.labelPods=false",
        "handler.podDisruptionBudget.minAvailable=2",
        "image.digest=sha256:" + "a" * 64,
        "agent.appArmorProfile.type=RuntimeDefault",
    ),
}


def dry_run_apply(api: client.ApiClient, docs: list[Doc]) -> list[tuple[str, str]]:
    """Server-side apply each document with dryRun=All and fieldValidation=Strict."""
    dyn = dynamic.DynamicClient(api)
    applied = []
    for doc in docs:
        if doc["kind"] in NOT_IN_A_BARE_API_SERVER:
            continue
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            dyn.server_side_apply(
                res,
                body=doc,
                namespace=doc["metadata"].get("namespace"),
                field_manager="execwatch-deploy-tests",
                force_conflicts=True,
                dry_run="All",
                query_params=[("fieldValidation", "Strict")],
            )
        except ApiException as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.body}") from None
        applied.append((doc["kind"], doc["metadata"]["name"]))
    return applied


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_chart_is_accepted_by_the_api_server(name: str, admin: client.ApiClient) -> None:
    docs = render(*VALUE_SETS[name])
    applied = dry_run_apply(admin, docs)
    assert len(applied) == len([d for d in docs if d["kind"] not in NOT_IN_A_BARE_API_SERVER])
    assert ("DaemonSet", "execwatch-agent") in applied
    assert ("Deployment", "execwatch-handler") in applied


def test_kustomize_base_is_accepted_by_the_api_server(admin: client.ApiClient) -> None:
    docs = kustomize_docs()
    assert len(dry_run_apply(admin, docs)) == len(docs)


def test_an_unknown_field_would_be_rejected(admin: client.ApiClient) -> None:
    """The check above has teeth: strict validation rejects a misspelt field."""
    ds = copy.deepcopy(find(render(), "DaemonSet"))
    pod_spec(ds)["containers"][0]["securityContext"]["capabilites"] = {"add": ["BPF"]}
    with pytest.raises(AssertionError, match="capabilites"):
        dry_run_apply(admin, [ds])


# -- Pod Security, enforced by the API server ------------------------------------------------


def namespace_enforcing(api: client.ApiClient, level: str) -> str:
    name = f"psa-{level}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(
            metadata={
                "name": name,
                "labels": {
                    "pod-security.kubernetes.io/enforce": level,
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            }
        )
    )
    return name


def pod_of(workload: Doc, namespace: str) -> dict[str, Any]:
    """The Pod the workload's controller would create (there is no controller here)."""
    tmpl = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{workload['metadata']['name']}-x",
            "namespace": namespace,
            "labels": tmpl["metadata"]["labels"],
        },
        "spec": copy.deepcopy(tmpl["spec"]),
    }


def create_pod_dry_run(api: client.ApiClient, pod: dict[str, Any]) -> None:
    client.CoreV1Api(api).create_namespaced_pod(pod["metadata"]["namespace"], pod, dry_run="All")


def test_handler_pod_is_admitted_where_restricted_is_enforced(admin: client.ApiClient) -> None:
    ns = namespace_enforcing(admin, "restricted")
    create_pod_dry_run(admin, pod_of(find(render(), "Deployment", "execwatch-handler"), ns))


def test_restricted_enforcement_is_real_the_agent_pod_is_refused(admin: client.ApiClient) -> None:
    ns = namespace_enforcing(admin, "restricted")
    with pytest.raises(ApiException) as err:
        create_pod_dry_run(admin, pod_of(find(render(), "DaemonSet", "execwatch-agent"), ns))
    assert err.value.status == 403
    body = json.loads(err.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in body
    for what in (
        "host namespaces (hostPID=true)",
        "unrestricted capabilities",
        'use restricted volume type "hostPath"',
        "runAsNonRoot != true",
        "forbidden AppArmor profile",
    ):
        assert what in body, what


def test_agent_needs_the_privileged_level_baseline_refuses_it(admin: client.ApiClient) -> None:
    agent = find(render(), "DaemonSet", "execwatch-agent")
    with pytest.raises(ApiException) as err:
        create_pod_dry_run(admin, pod_of(agent, namespace_enforcing(admin, "baseline")))
    assert err.value.status == 403
    message = json.loads(err.value.body)["message"]
    assert "hostPID=true" in message and "non-default capabilities" in message
    create_pod_dry_run(admin, pod_of(agent, namespace_enforcing(admin, "privileged")))


def test_the_chart_namespace_admits_the_agent(admin: client.ApiClient) -> None:
    docs = render("namespace.create=true")
    labels = find(docs, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    create_pod_dry_run(
        admin,
        pod_of(
            find(docs, "DaemonSet"),
            namespace_enforcing(admin, labels["pod-security.kubernetes.io/enforce"]),
        ),
    )
