"""The chart's placement (`placement.enabled`): what it renders, that the command accepts
it, that the real API server accepts it, and that docs/privileges.md explains each right.
tests/placement/test_cli.py runs the command with these very RBAC rules."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import pytest
import yaml
from kubernetes import client

from execwatch import cli
from tests.deploy.test_apiserver import (
    create_pod_dry_run,
    dry_run_apply,
    namespace_enforcing,
    pod_of,
)
from tests.support.deploy.chart import (
    CHART,
    KUBE_VERSION,
    KUSTOMIZE,
    REPO,
    Doc,
    cli_accepts,
    find,
    pod_spec,
    render,
    run_helm,
    smallest_accepted,
)

ON = "placement.enabled=true"
NAME = "execwatch-placement"
PLACEMENT = {
    ("CustomResourceDefinition", "imageverdicts.execwatch.io"),
    ("ServiceAccount", NAME),
    ("Role", NAME),
    ("RoleBinding", NAME),
    ("ClusterRole", NAME),
    ("ClusterRoleBinding", NAME),
    ("ClusterRole", f"{NAME}-pull-credentials"),
    ("ValidatingAdmissionPolicy", f"{NAME}-pod-patches"),
    ("ValidatingAdmissionPolicyBinding", f"{NAME}-pod-patches"),
    ("ValidatingAdmissionPolicy", f"{NAME}-pull-credentials"),
    ("ValidatingAdmissionPolicyBinding", f"{NAME}-pull-credentials"),
    ("Secret", f"{NAME}-tls"),
    ("MutatingWebhookConfiguration", NAME),
    ("ValidatingWebhookConfiguration", NAME),
    ("Deployment", NAME),
    ("PodDisruptionBudget", NAME),
    ("Service", NAME),
    ("NetworkPolicy", NAME),
    ("NetworkPolicy", f"{NAME}-egress"),
}
HOOK = ("Job", f"{NAME}-release")
# The hook's own identity: with Helm only, as the hook.
HOOK_RIGHTS = {
    ("ServiceAccount", HOOK[1]),
    ("ClusterRole", HOOK[1]),
    ("ClusterRoleBinding", HOOK[1]),
}
FEEDBACK_NAME = "execwatch-handler-placement-feedback"
FEEDBACK = {("ClusterRole", FEEDBACK_NAME), ("ClusterRoleBinding", FEEDBACK_NAME)}


def names(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_helm_lint_is_clean_with_placement_on() -> None:
    out = run_helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "--set", ON)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout


def test_off_by_default_and_on_it_adds_exactly_placement() -> None:
    off, on = names(render()), names(render(ON))
    assert not PLACEMENT & off
    assert on - off == {*PLACEMENT, *FEEDBACK, HOOK, *HOOK_RIGHTS}
    assert names(render(ON, "placement.feedback=false")) - off == {*PLACEMENT, HOOK, *HOOK_RIGHTS}


def handler_args(*values: str) -> list[str]:
    return list(
        pod_spec(find(render(*values), "Deployment", "execwatch-handler"))["containers"][0]["args"]
    )


def test_the_handler_feeds_placement_back_only_with_placement_and_feedback_on() -> None:
    assert "--placement-feedback" not in handler_args()
    assert "--placement-feedback" in handler_args(ON)
    assert "--placement-feedback" not in handler_args(ON, "placement.feedback=false")


def test_the_handlers_feedback_rights_are_those_of_deploy_base_optional() -> None:
    source = REPO / "deploy/base/optional/placement-feedback.yaml"
    base = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(source.read_text())}
    docs = render(ON)
    role = find(docs, "ClusterRole", FEEDBACK_NAME)
    assert role["rules"] == base[("ClusterRole", FEEDBACK_NAME)]["rules"]
    binding = find(docs, "ClusterRoleBinding", FEEDBACK_NAME)
    assert [s["name"] for s in binding["subjects"]] == ["execwatch-handler"]
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert verbs == {
        ("imageverdicts", "get"),
        ("imageverdicts", "create"),
        ("imageverdicts", "update"),
        ("namespaces", "get"),
        ("pods/eviction", "create"),
    }


def test_the_uninstall_hook_stops_the_gating_then_ungates_with_its_own_rights() -> None:
    job = find(render(ON), "Job", HOOK[1])
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == f"{NAME}-release"
    parsed = cli.build_parser("placement").parse_args(spec["containers"][0]["args"])
    assert parsed.release and parsed.webhook_configuration == NAME


def test_the_crd_is_that_of_deploy_placement() -> None:
    crd = find(render(ON), "CustomResourceDefinition", "imageverdicts.execwatch.io")
    source = yaml.safe_load((REPO / "deploy/placement/imageverdict-crd.yaml").read_text())
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_the_webhook_calls_only_opted_in_namespaces_and_never_blocks_a_pod() -> None:
    """gate mutates; warn validates, so the pod has its final name and UID."""
    docs = render(ON)
    gate, warn = (find(docs, f"{kind}WebhookConfiguration", NAME)["webhooks"]
                  for kind in ("Mutating", "Validating"))  # fmt: skip
    hooks = {h["name"]: h for h in [*gate, *warn]}
    assert [h["name"] for h in gate] == ["gate.placement.execwatch.io"]
    assert [h["name"] for h in warn] == ["warn.placement.execwatch.io"]
    modes = {"gate": ["enforce", "mitigate"], "warn": ["warn"]}
    for hook in hooks.values():
        kind = hook["name"].split(".")[0]
        service = hook["clientConfig"]["service"]
        assert service == {"name": NAME, "namespace": "execwatch", "path": f"/{kind}", "port": 443}
        assert "caBundle" not in hook["clientConfig"], "the controller sets it"
        opt_in, exclude = hook["namespaceSelector"]["matchExpressions"]
        assert opt_in == {"key": "execwatch.io/placement", "operator": "In", "values": modes[kind]}
        assert exclude["operator"] == "NotIn"
        assert {"execwatch", "kube-system"} <= set(exclude["values"])
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 5
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                  "operations": ["CREATE"], "resources": ["pods"],
                                  "scope": "Namespaced"}]  # fmt: skip
    assert hooks["warn.placement.execwatch.io"]["sideEffects"] == "NoneOnDryRun"


def test_the_certificate_secret_is_an_empty_tls_secret_for_the_controller_to_fill() -> None:
    secret = find(render(ON), "Secret", f"{NAME}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["data"] == {"tls.crt": "", "tls.key": ""}
    deployment = find(render(ON), "Deployment", NAME)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{NAME}-tls"


@pytest.mark.parametrize(
    "sets",
    [(), ("placement.strict=true", "placement.registry.insecure[0]=registry.local:5000",
          "placement.registry.caConfigMap=registry-ca",
          "placement.webhook.clientCAConfigMap=apiserver-client-ca",
          "placement.registry.allowPrivate[0]=10.1.0.0/16")],
    ids=["defaults", "options"],
)  # fmt: skip
def test_the_deployment_runs_the_command_with_flags_it_accepts(sets: tuple[str, ...]) -> None:
    deployment = find(render(ON, *sets), "Deployment", NAME)
    container = pod_spec(deployment)["containers"][0]
    args = container["args"]
    assert args[1] == "placement"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    files = ("--registry-ca=", "--webhook-client-ca=")
    ca = [a.split("=", 1)[1] for a in args if a.startswith(files)]
    assert all(path.rsplit("/", 1)[0] in mounts for path in ca)
    # the CA files exist only in the pod: parse with one that exists here
    here = [a.split("=", 1)[0] + f"={__file__}" if a.startswith(files) else a for a in args]
    parsed = cli.build_parser("placement").parse_args(here)
    assert parsed.tls_dir in mounts and parsed.cache_dir in mounts
    if sets:
        assert parsed.strict and parsed.insecure_registry == ["registry.local:5000"]
        assert parsed.registry_ca and parsed.webhook_client_ca and len(ca) == 2
        assert parsed.registry_allow_private == [ipaddress.ip_network("10.1.0.0/16")]
    else:
        assert parsed.registry_allow_private == []  # every non-global address refused


def test_two_replicas_spread_with_a_disruption_budget() -> None:
    docs = render(ON)
    deployment = find(docs, "Deployment", NAME)
    assert deployment["spec"]["replicas"] == 2
    assert pod_spec(deployment)["affinity"]["podAntiAffinity"]
    assert find(docs, "PodDisruptionBudget", NAME)["spec"]["minAvailable"] == 1


def test_the_network_policy_opens_the_webhook_port_and_metrics_to_monitoring_only() -> None:
    policy = find(render(ON), "NetworkPolicy", NAME)
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "webhook", "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    narrowed = render(ON, "placement.webhookFrom[0].ipBlock.cidr=10.0.0.1/32")
    first = find(narrowed, "NetworkPolicy", NAME)["spec"]["ingress"][0]
    assert first["from"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


def test_the_egress_policy_allows_dns_the_api_server_and_global_registries() -> None:
    """Issue 34, item 6: egress was open. Registries are reached at global addresses on
    443, and at a private network only when placement.registry.allowPrivate lists it."""
    policy = find(render(ON), "NetworkPolicy", f"{NAME}-egress")["spec"]
    assert policy["policyTypes"] == ["Egress"]
    dns, api, registries = policy["egress"]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert [p["port"] for p in api["ports"]] == [443, 6443]
    assert [p["port"] for p in registries["ports"]] == [443]
    v4 = registries["to"][0]["ipBlock"]
    assert v4["cidr"] == "0.0.0.0/0"
    for private in ("10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12"):
        assert private in v4["except"]
    listed = render(ON, "placement.registry.allowPrivate[0]=10.1.0.0/16")
    allowed = find(listed, "NetworkPolicy", f"{NAME}-egress")["spec"]["egress"][3]
    assert allowed == {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}
    narrowed = render(ON, "placement.egress.apiServer[0].ipBlock.cidr=10.0.0.1/32")
    api = find(narrowed, "NetworkPolicy", f"{NAME}-egress")["spec"]["egress"][1]
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    with pytest.raises(RuntimeError, match="allowPrivate"):
        render(ON, "placement.registry.allowPrivate[0]=not-a-network")


SCHEMA_FLAGS = [
    ("leaseDuration", "--lease-duration"),
    ("renewDeadline", "--renew-deadline"),
    ("retryPeriod", "--retry-period"),
    ("workers", "--workers"),
    ("budget", "--budget"),
]


@pytest.mark.parametrize(("name", "flag"), SCHEMA_FLAGS)
def test_the_schema_accepts_only_what_the_command_accepts(name: str, flag: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    bounds = schema["properties"]["placement"]["properties"][name]
    assert cli_accepts("placement", flag, bounds["maximum"])
    assert cli_accepts("placement", flag, smallest_accepted(bounds))
    with pytest.raises(RuntimeError, match=name):
        render(ON, f"placement.{name}={bounds['maximum'] + 1}")


def test_the_api_server_accepts_it_and_the_pod_passes_restricted(admin: client.ApiClient) -> None:
    docs = render(ON)
    applied = dry_run_apply(admin, docs)
    assert set(applied) >= {*PLACEMENT, HOOK, *HOOK_RIGHTS}
    ns = namespace_enforcing(admin, "restricted")
    create_pod_dry_run(admin, pod_of(find(docs, "Deployment", NAME), ns))


def rules(docs: list[Doc]) -> list[dict[str, Any]]:
    return [
        rule
        for d in docs
        if d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"].startswith(NAME)
        for rule in d["rules"]
    ]


def test_privileges_doc_explains_every_placement_verb() -> None:
    text = (REPO / "docs" / "privileges.md").read_text()
    section = text[text.index("## Placement") :]
    for rule in rules(render(ON)):
        for res in rule["resources"]:
            for verb in rule["verbs"]:
                assert re.search(rf"`{res}`[^\n]*`{verb}`", section), (res, verb)


def test_the_kustomize_component_is_the_chart_with_placement_on() -> None:
    d = KUSTOMIZE / "components" / "placement"
    component = yaml.safe_load((d / "kustomization.yaml").read_text())
    docs = [x for r in component["resources"] for x in yaml.safe_load_all((d / r).read_text()) if x]
    assert names(docs) == {*PLACEMENT, *FEEDBACK}
    # Its one patch starts the handler with --placement-feedback.
    assert component["patches"] == [{"path": "patch-handler-deployment.yaml"}]
    patch = yaml.safe_load((d / "patch-handler-deployment.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert "--placement-feedback" in container["args"]
