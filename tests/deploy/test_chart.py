"""The Helm chart: lint, what each value set renders, and the privileges it grants."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from execwatch.agent import cli as agent_cli
from execwatch.handler import cli as handler_cli
from tests.support.deploy.chart import (
    CHART,
    KUBE_VERSION,
    Doc,
    base_docs,
    cli_accepts,
    find,
    kinds,
    pod_spec,
    render,
    run_helm,
    smallest_accepted,
)

DEFAULT_KINDS = {
    "CustomResourceDefinition",
    "ResourceQuota",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "DaemonSet",
    "Deployment",
    "PodDisruptionBudget",
    "Service",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "NetworkPolicy",
    "FlowSchema",
    "PriorityLevelConfiguration",
}
EVERYTHING = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "openshift.scc.enabled=true",
)


@pytest.mark.parametrize("sets", [(), EVERYTHING], ids=["defaults", "everything-on"])
def test_helm_lint_is_clean(sets: tuple[str, ...]) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    out = run_helm(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_defaults_install_the_pipeline_and_no_optional_integration() -> None:
    docs = render()
    assert kinds(docs) == DEFAULT_KINDS
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("DaemonSet", "execwatch-agent") in names
    assert ("Deployment", "execwatch-handler") in names
    for doc in docs:
        if doc["kind"] not in (
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "FlowSchema",
            "PriorityLevelConfiguration",
        ):
            assert doc["metadata"]["namespace"] == "execwatch", doc["metadata"]


def test_everything_on_adds_monitoring_dashboard_and_scc() -> None:
    docs = render(*EVERYTHING)
    assert kinds(docs) - DEFAULT_KINDS == {
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
        "SecurityContextConstraints",
    }
    dash = find(docs, "ConfigMap", "execwatch-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize(
    ("off", "gone"),
    [
        (
            "agent.enabled=false",
            {
                ("DaemonSet", "execwatch-agent"),
                ("Service", "execwatch-agent"),
                ("ServiceAccount", "execwatch-agent"),
                ("Role", "execwatch-agent"),
            },
        ),
        (
            "handler.enabled=false",
            {
                ("Deployment", "execwatch-handler"),
                ("ClusterRole", "execwatch-handler"),
                ("PodDisruptionBudget", "execwatch-handler"),
            },
        ),
        ("crd.install=false", {("CustomResourceDefinition", "execfailures.execwatch.io")}),
        ("resourceQuota.enabled=false", {("ResourceQuota", "execwatch-records")}),
        (
            "rbac.create=false",
            {
                ("Role", "execwatch-agent"),
                ("ClusterRole", "execwatch-handler"),
                ("RoleBinding", "execwatch-handler"),
            },
        ),
        (
            "service.enabled=false",
            {("Service", "execwatch-agent"), ("Service", "execwatch-handler")},
        ),
        (
            "handler.podDisruptionBudget.enabled=false",
            {("PodDisruptionBudget", "execwatch-handler")},
        ),
        (
            "handler.podPatchPolicy=false",
            {
                ("ValidatingAdmissionPolicy", "execwatch-handler-pod-patches"),
                ("ValidatingAdmissionPolicyBinding", "execwatch-handler-pod-patches"),
                ("ClusterRole", "execwatch-handler-pod-labeler"),
                ("ClusterRoleBinding", "execwatch-handler-pod-labeler"),
            },
        ),
        (
            "agent.ownNodePolicy=false",
            {
                ("ValidatingAdmissionPolicy", "execwatch-agent-own-node"),
                ("ValidatingAdmissionPolicyBinding", "execwatch-agent-own-node"),
            },
        ),
        (
            "agent.recordMetadataPolicy=false",
            {
                ("ValidatingAdmissionPolicy", "execwatch-agent-record-metadata"),
                ("ValidatingAdmissionPolicyBinding", "execwatch-agent-record-metadata"),
            },
        ),
        (
            "networkPolicy.enabled=false",
            {("NetworkPolicy", "execwatch-agent"), ("NetworkPolicy", "execwatch-handler")},
        ),
        (
            "flowControl.enabled=false",
            {
                ("FlowSchema", "execwatch-agents"),
                ("PriorityLevelConfiguration", "execwatch-agents"),
            },
        ),
    ],
)
def test_each_piece_can_be_turned_off(off: str, gone: set[tuple[str, str]]) -> None:
    before = {(d["kind"], d["metadata"]["name"]) for d in render()}
    after = {(d["kind"], d["metadata"]["name"]) for d in render(off)}
    assert gone <= before
    assert not gone & after, f"{off} left {gone & after}"


def test_the_namespace_is_rendered_only_on_request_and_for_plain_manifests() -> None:
    """`helm install` needs its namespace before it creates anything (docs/install.md)."""
    assert "Namespace" not in kinds(render())
    for on in ("namespace.create=true", "plainManifests=true"):
        labels = find(render(on), "Namespace", "execwatch")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_values_are_checked_against_the_schema() -> None:
    with pytest.raises(RuntimeError, match="podMetadata"):
        render("agent.podMetadata=cri")
    with pytest.raises(RuntimeError, match="additional properties"):
        render("agent.privileged=true")


# chart value -> the flag its template passes it as
CHART_FLAGS = [
    ("agent", "aggregationWindow", "--aggregation-window"),
    ("agent", "rate", "--rate"),
    ("agent", "burst", "--burst"),
    ("agent", "spoolSize", "--spool-size"),
    ("agent", "spoolBytes", "--spool-bytes"),
    ("handler", "leaseDuration", "--lease-duration"),
    ("handler", "renewDeadline", "--renew-deadline"),
    ("handler", "retryPeriod", "--retry-period"),
    ("handler", "maxSeries", "--max-series"),
]


@pytest.mark.parametrize(("section", "name", "flag"), CHART_FLAGS)
def test_the_schema_accepts_only_what_the_command_accepts(
    section: str, name: str, flag: str
) -> None:
    """A value helm accepts and the agent refuses would be a crash loop on every node."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    bounds = schema["properties"][section]["properties"][name]
    assert cli_accepts(section, flag, bounds["maximum"])
    assert cli_accepts(section, flag, smallest_accepted(bounds))
    template = (CHART / "templates").glob("*.yaml")
    short = "$a" if section == "agent" else "$h"
    assert any(f"- {flag}={{{{ {short}.{name}" in f.read_text() for f in template)


def test_an_out_of_range_value_is_refused_by_helm() -> None:
    with pytest.raises(RuntimeError, match="rate"):
        render("agent.rate=20000")


# -- the agent: root with a few capabilities, never privileged ---------------------------

AGENT_CAPS = ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"]  # the defaults
OPTIONAL_CAPS = ["SYS_RESOURCE"]  # kernels without memcg_accounting (compat.bpf.h) only


def agent_container(docs: list[Doc]) -> Doc:
    spec = pod_spec(find(docs, "DaemonSet", "execwatch-agent"))
    (c,) = spec["containers"]
    container: Doc = c
    return container


def test_agent_is_not_privileged_and_adds_only_the_justified_capabilities() -> None:
    docs = render()
    spec = pod_spec(find(docs, "DaemonSet", "execwatch-agent"))
    sc = agent_container(docs)["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsUser"] == 0
    assert sc["capabilities"] == {"drop": ["ALL"], "add": AGENT_CAPS}
    assert spec["hostPID"] is True
    assert spec["hostNetwork"] is False and spec["hostIPC"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_every_added_capability_is_justified_in_a_comment_next_to_it() -> None:
    text = (CHART / "templates" / "agent-daemonset.yaml").read_text()
    for cap in AGENT_CAPS + OPTIONAL_CAPS:
        line = text.index(f"- {cap}\n")
        comment = text.rfind(f"# {cap}:", 0, line)
        assert comment != -1 and line - comment < 600, f"{cap} has no justification above it"


@pytest.mark.parametrize(
    ("sets", "caps"),
    [
        (
            ("agent.capabilities.sysResource=true",),
            ["BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE", "DAC_READ_SEARCH"],
        ),
        (
            ("agent.capabilities.dacReadSearch=false", "agent.capabilities.sysPtrace=false"),
            ["BPF", "PERFMON"],
        ),
    ],
)
def test_optional_capabilities_can_be_dropped(sets: tuple[str, ...], caps: list[str]) -> None:
    assert agent_container(render(*sets))["securityContext"]["capabilities"]["add"] == caps


def test_agent_mounts_host_paths_read_only_and_nothing_else_of_the_host() -> None:
    docs = render()
    spec = pod_spec(find(docs, "DaemonSet", "execwatch-agent"))
    mounts = {m["name"]: m for m in agent_container(docs)["volumeMounts"]}
    host = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert {n: h["path"] for n, h in host.items()} == {
        "tracefs": "/sys/kernel/tracing",
        "btf": "/sys/kernel/btf",
        "cgroup": "/sys/fs/cgroup",
        "cri-socket": "/run/containerd/containerd.sock",
        "spool": "/var/lib/execwatch",
    }
    # The one writable host path: the agent's own spool directory.
    spool = host.pop("spool")
    assert spool["type"] == "DirectoryOrCreate"
    assert mounts["spool"]["mountPath"] == "/var/lib/execwatch"
    assert not mounts["spool"].get("readOnly")
    for name in host:
        assert mounts[name]["readOnly"] is True, name
        assert mounts[name]["mountPath"] == host[name]["path"]
    assert host["cri-socket"]["type"] == "Socket"


def test_the_spool_follows_its_host_path_or_stays_in_memory() -> None:
    args = agent_container(render())["args"]
    assert "--spool-dir=/var/lib/execwatch" in args and "--spool-bytes=33554432" in args
    custom = pod_spec(find(render("agent.spoolHostPath=/data/ew"), "DaemonSet"))
    assert {
        "name": "spool",
        "hostPath": {"path": "/data/ew", "type": "DirectoryOrCreate"},
    } in custom["volumes"]
    docs = render("agent.spoolHostPath=")
    assert all(v["name"] != "spool" for v in pod_spec(find(docs, "DaemonSet"))["volumes"])
    assert "--spool-dir=" in agent_container(docs)["args"]


def test_the_agent_rolls_with_a_surge_so_no_node_is_unwatched() -> None:
    ds = find(render(), "DaemonSet", "execwatch-agent")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    env = {e["name"]: e for e in agent_container(render())["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_cri_socket_follows_the_value_or_is_left_out() -> None:
    crio = pod_spec(find(render("agent.criSocket=/run/crio/crio.sock"), "DaemonSet"))
    assert {
        "name": "cri-socket",
        "hostPath": {"path": "/run/crio/crio.sock", "type": "Socket"},
    } in crio["volumes"]
    none = pod_spec(find(render("agent.criSocket="), "DaemonSet"))
    assert all(v["name"] != "cri-socket" for v in none["volumes"])


def test_agent_runs_on_every_node() -> None:
    ds = find(render(), "DaemonSet", "execwatch-agent")
    spec = pod_spec(ds)
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_agent_command_line_uses_flags_the_agent_has() -> None:
    parser = _cluster_parser()
    for kind, sets in (
        ("DaemonSet", ()),
        ("Deployment", ("handler.podLabelMetric=true", "handler.labelPods=false")),
    ):
        c = pod_spec(find(render(*sets), kind))["containers"][0]
        args = parser.parse_args(c["args"])
        assert args.command in ("agent", "handler")
        assert args.metrics_address[1] == c["ports"][0]["containerPort"]


def test_the_agent_reads_the_nodes_binfmt_table_through_inits_root() -> None:
    """In its container the agent's own /proc/sys/fs/binfmt_misc is empty: the node's
    table and emulators are read in init's root, reachable because the pod has hostPID."""
    for sets in ((), ("agent.runAsNonRoot=true",)):
        docs = render(*sets)
        args = _cluster_parser().parse_args(agent_container(docs)["args"])
        assert str(args.host_root) == "/proc/1/root"
        assert pod_spec(find(docs, "DaemonSet", "execwatch-agent"))["hostPID"] is True
        caps = agent_container(docs)["securityContext"]["capabilities"]["add"]
        assert "SYS_PTRACE" in caps, "opening init's root is a ptrace access check"


def _cluster_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="execwatch")
    parser.add_argument("--log-level")
    sub = parser.add_subparsers(dest="command", required=True)
    agent_cli.add_parser(sub)
    handler_cli.add_parser(sub)
    return parser


# -- the handler: restricted ---------------------------------------------------------------


def test_handler_has_two_replicas_spread_and_a_disruption_budget() -> None:
    docs = render()
    dep = find(docs, "Deployment", "execwatch-handler")
    assert dep["spec"]["replicas"] == 2
    anti = pod_spec(dep)["affinity"]["podAntiAffinity"]
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"]
        == "kubernetes.io/hostname"
    )
    assert find(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_handler_security_context_is_what_restricted_asks() -> None:
    spec = pod_spec(find(render(), "Deployment", "execwatch-handler"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(spec.get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))
    assert all("hostPath" not in v for v in spec["volumes"])
    (c,) = spec["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


# -- the chart templates deploy/base: same CRD, same rules, same quota ---------------------


# deploy/base/optional: rendered only with agent.podMetadata=api, metricsAuth.enabled.
OPTIONAL_RBAC = (
    "execwatch-agent-pod-reader",
    "execwatch-metrics-auth",
    "execwatch-handler-placement-feedback",
)


def _rbac(docs: list[Doc]) -> dict[tuple[str, str], Any]:
    return {
        (d["kind"], d["metadata"]["name"]): d["rules"]
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }


def test_rbac_rules_are_exactly_those_of_deploy_base() -> None:
    chart = _rbac(render())
    base = {k: v for k, v in _rbac(base_docs()).items() if k[1] not in OPTIONAL_RBAC}
    assert chart == base


def test_bindings_and_service_accounts_match_deploy_base() -> None:
    def bindings(docs: list[Doc]) -> set[tuple[str, str, str, str]]:
        return {
            (
                d["kind"],
                d["metadata"]["name"],
                d["roleRef"]["name"],
                ",".join(f"{s['namespace']}/{s['name']}" for s in d["subjects"]),
            )
            for d in docs
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        }

    docs = render()
    assert bindings(docs) == bindings(
        [d for d in base_docs() if d["metadata"]["name"] not in OPTIONAL_RBAC]
    )
    sas = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    assert sas == {d["metadata"]["name"] for d in base_docs() if d["kind"] == "ServiceAccount"}


def test_crd_spec_is_that_of_deploy_base() -> None:
    chart = find(render(), "CustomResourceDefinition")
    base = find(base_docs(), "CustomResourceDefinition")
    assert chart["spec"] == base["spec"]
    assert chart["metadata"]["name"] == base["metadata"]["name"]
    assert chart["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_resource_quota_is_that_of_deploy_base() -> None:
    assert find(render(), "ResourceQuota")["spec"] == find(base_docs(), "ResourceQuota")["spec"]


def test_agent_pod_reader_option_uses_the_optional_base_rules() -> None:
    docs = render("agent.podMetadata=api")
    base = _rbac(base_docs())
    assert (
        find(docs, "ClusterRole", "execwatch-agent-pod-reader")["rules"]
        == base[("ClusterRole", "execwatch-agent-pod-reader")]
    )


@pytest.mark.parametrize(
    ("policy", "user"),
    [
        ("execwatch-handler-pod-patches", "handler"),
        ("execwatch-agent-own-node", "agent"),
        ("execwatch-agent-record-metadata", "agent"),
    ],
)
def test_admission_policies_are_those_of_deploy_base(policy: str, user: str) -> None:
    """Same policies; the user names come from the release namespace."""
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert find(render(), kind, policy)["spec"] == find(base_docs(), kind, policy)["spec"]
    other = find(render(namespace="observability"), "ValidatingAdmissionPolicy", policy)
    condition = other["spec"]["matchConditions"][0]["expression"]
    assert f"system:serviceaccount:observability:execwatch-{user}" in condition


def _grants_pod_patch(docs: list[Doc]) -> bool:
    return any(
        "pods" in rule.get("resources", []) and "patch" in rule.get("verbs", [])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d["rules"]
    )


@pytest.mark.parametrize(
    "off", ["handler.podPatchPolicy=false", "handler.labelPods=false", "handler.enabled=false"]
)
def test_pods_patch_is_granted_only_together_with_the_policy_that_narrows_it(off: str) -> None:
    assert _grants_pod_patch(render())
    assert not _grants_pod_patch(render(off))


# -- monitoring pieces ---------------------------------------------------------------------


def test_service_monitors_scrape_both_components_and_label_agents_with_their_node() -> None:
    docs = render("serviceMonitor.enabled=true")
    agent = find(docs, "ServiceMonitor", "execwatch-agent")
    handler = find(docs, "ServiceMonitor", "execwatch-handler")
    svc = find(docs, "Service", "execwatch-agent")
    assert agent["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert agent["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert agent["spec"]["endpoints"][0]["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        }
    ]
    assert "relabelings" not in handler["spec"]["endpoints"][0]


def test_the_handler_keeps_the_failing_pods_labels_over_prometheus_operators() -> None:
    """prometheus-operator adds namespace/pod/container target labels; the handler's
    series describe another pod, so its own labels must win (honorLabels), while the
    agent's series describe the agent and keep the target's labels."""
    docs = render("serviceMonitor.enabled=true")
    (handler,) = find(docs, "ServiceMonitor", "execwatch-handler")["spec"]["endpoints"]
    (agent,) = find(docs, "ServiceMonitor", "execwatch-agent")["spec"]["endpoints"]
    assert handler["honorLabels"] is True
    assert "honorLabels" not in agent


# -- network and API server exposure ------------------------------------------------------


def test_network_policies_admit_only_the_monitoring_namespaces_on_the_metrics_port() -> None:
    docs = render()
    for component, workload in (("agent", "DaemonSet"), ("handler", "Deployment")):
        policy = find(docs, "NetworkPolicy", f"execwatch-{component}")["spec"]
        pod_labels = find(docs, workload)["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert policy["policyTypes"] == ["Ingress"]  # egress: the API server, left open
        (rule,) = policy["ingress"]
        assert rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        (container,) = pod_spec(find(docs, workload))["containers"]
        assert [p["name"] for p in container["ports"]] == ["metrics"]


def test_network_policies_follow_the_monitoring_namespaces_set() -> None:
    two = render(
        "networkPolicy.metricsFrom[0].matchLabels.team=observability",
        "networkPolicy.metricsFrom[1].matchLabels.kubernetes\\.io/metadata\\.name=openshift-user-workload-monitoring",
    )
    (rule,) = find(two, "NetworkPolicy", "execwatch-handler")["spec"]["ingress"]
    assert [f["namespaceSelector"]["matchLabels"] for f in rule["from"]] == [
        {"team": "observability"},
        {"kubernetes.io/metadata.name": "openshift-user-workload-monitoring"},
    ]
    none = render("networkPolicy.metricsFrom=null")
    assert find(none, "NetworkPolicy", "execwatch-agent")["spec"]["ingress"] == []
    with pytest.raises(RuntimeError, match="metricsFrom"):
        render("networkPolicy.metricsFrom[0].podSelector.x=y")


def test_the_agents_api_priority_level_is_that_of_deploy_base() -> None:
    for kind in ("FlowSchema", "PriorityLevelConfiguration"):
        base = find(base_docs(), kind, "execwatch-agents")["spec"]
        assert find(render(), kind, "execwatch-agents")["spec"] == base
    other = find(render(namespace="observability"), "FlowSchema", "execwatch-agents")
    (subject,) = other["spec"]["rules"][0]["subjects"]
    assert subject["serviceAccount"] == {"name": "execwatch-agent", "namespace": "observability"}


def test_scc_allows_exactly_what_the_agent_asks() -> None:
    docs = render("openshift.scc.enabled=true")
    scc = find(docs, "SecurityContextConstraints")
    c = agent_container(docs)
    assert scc["allowedCapabilities"] == c["securityContext"]["capabilities"]["add"]
    assert scc["allowPrivilegedContainer"] is False
    assert scc["allowHostPID"] is True and scc["allowHostNetwork"] is False
    assert scc["readOnlyRootFilesystem"] is True
    use = find(docs, "Role", "execwatch-agent-scc")
    assert use["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": ["execwatch-agent"],
            "verbs": ["use"],
        }
    ]
    assert pod_spec(find(docs, "DaemonSet"))["securityContext"]["seLinuxOptions"] == {
        "type": "spc_t"
    }
