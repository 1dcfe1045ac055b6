"""metricsAuth in the chart and the kustomize component: off by default; on, the agent and
the handler get `--metrics-auth`, HTTPS probes of the open /healthz, the review rights of
deploy/base/optional/metrics-auth.yaml, and the ServiceMonitors scrape with a token."""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client

from tests.deploy.test_apiserver import (
    create_pod_dry_run,
    dry_run_apply,
    namespace_enforcing,
    pod_of,
)
from tests.support.deploy.chart import KUSTOMIZE, Doc, base_docs, find, pod_spec, render

AUTH = "metricsAuth.enabled=true"
NAMES = ("execwatch-metrics-auth", "execwatch-metrics-reader")


def container(docs: list[Doc], kind: str) -> Doc:
    c: Doc = pod_spec(find(docs, kind))["containers"][0]
    return c


def test_off_by_default_nothing_changes() -> None:
    docs = render("serviceMonitor.enabled=true")
    assert not [d for d in docs if d["metadata"]["name"] in NAMES]
    for kind in ("DaemonSet", "Deployment"):
        c = container(docs, kind)
        assert not [a for a in c["args"] if a.startswith("--metrics-auth")]
        assert "scheme" not in c["readinessProbe"]["httpGet"]
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        assert "scheme" not in endpoint and "bearerTokenFile" not in endpoint


def test_on_both_components_authenticate_and_probe_the_open_healthz_over_https() -> None:
    docs = render(AUTH)
    for kind in ("DaemonSet", "Deployment"):
        c = container(docs, kind)
        assert "--metrics-auth" in c["args"]
        assert not [a for a in c["args"] if a.startswith("--metrics-tls")]  # self-signed
        for probe in ("readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            # The agent's readiness has its own open path: ready once the probe is loaded.
            path = "/readyz" if (kind, probe) == ("DaemonSet", "readinessProbe") else "/healthz"
            assert (get["path"], get["port"], get["scheme"]) == (path, "metrics", "HTTPS")


def test_on_the_review_rights_are_those_of_deploy_base_for_both_service_accounts() -> None:
    docs = render(AUTH)
    base = {(d["kind"], d["metadata"]["name"]): d for d in base_docs()}
    role = find(docs, "ClusterRole", "execwatch-metrics-auth")
    assert role["rules"] == base[("ClusterRole", "execwatch-metrics-auth")]["rules"]
    binding = find(docs, "ClusterRoleBinding", "execwatch-metrics-auth")
    assert binding["subjects"] == base[("ClusterRoleBinding", "execwatch-metrics-auth")]["subjects"]
    only_agent = find(render(AUTH, "handler.enabled=false"), "ClusterRoleBinding", NAMES[0])
    assert [s["name"] for s in only_agent["subjects"]] == ["execwatch-agent"]


def test_the_scraper_role_reads_only_metrics_and_is_bound_to_the_given_scrapers() -> None:
    docs = render(AUTH)
    reader = find(docs, "ClusterRole", "execwatch-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not [
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == NAMES[1]
    ]
    docs = render(
        AUTH,
        "metricsAuth.scrapers[0].namespace=openshift-user-workload-monitoring",
        "metricsAuth.scrapers[0].name=prometheus-user-workload",
    )
    binding = find(docs, "ClusterRoleBinding", "execwatch-metrics-reader")
    assert binding["roleRef"]["name"] == "execwatch-metrics-reader"
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "prometheus-user-workload",
            "namespace": "openshift-user-workload-monitoring",
        }
    ]


def test_a_tls_secret_is_mounted_and_named_in_the_flags() -> None:
    docs = render(
        AUTH, "metricsAuth.tlsSecret.agent=agent-metrics-tls", "metricsAuth.audiences[0]=x"
    )
    c = container(docs, "DaemonSet")
    assert "--metrics-tls-cert=/etc/execwatch/metrics-tls/tls.crt" in c["args"]
    assert "--metrics-tls-key=/etc/execwatch/metrics-tls/tls.key" in c["args"]
    assert "--metrics-auth-audience=x" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "metrics-tls")
    assert mount == {
        "name": "metrics-tls",
        "mountPath": "/etc/execwatch/metrics-tls",
        "readOnly": True,
    }
    volume = next(
        v for v in pod_spec(find(docs, "DaemonSet"))["volumes"] if v["name"] == "metrics-tls"
    )
    assert volume["secret"] == {"secretName": "agent-metrics-tls"}
    handler = container(docs, "Deployment")
    assert not [a for a in handler["args"] if a.startswith("--metrics-tls")]


def test_service_monitors_scrape_over_https_with_a_token() -> None:
    docs = render(AUTH, "serviceMonitor.enabled=true")
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        endpoint = monitor["spec"]["endpoints"][0]
        assert endpoint["scheme"] == "https"
        assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
        assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    docs = render(
        AUTH,
        "serviceMonitor.enabled=true",
        "metricsAuth.serviceMonitor.authorization.credentials.name=scrape-token",
        "metricsAuth.serviceMonitor.authorization.credentials.key=token",
    )
    endpoint = find(docs, "ServiceMonitor", "execwatch-agent")["spec"]["endpoints"][0]
    assert endpoint["authorization"] == {"credentials": {"name": "scrape-token", "key": "token"}}
    assert "bearerTokenFile" not in endpoint


def test_the_kustomize_component_adds_the_rbac_and_patches_both_workloads() -> None:
    d = KUSTOMIZE / "components" / "metrics-auth"
    component = yaml.safe_load((d / "kustomization.yaml").read_text())
    docs: list[Any] = [
        x for r in component["resources"] for x in yaml.safe_load_all((d / r).read_text()) if x
    ]
    assert {x["metadata"]["name"] for x in docs} == {*NAMES, "execwatch-metrics-auth"}
    patched = {}
    for patch in component["patches"]:
        for doc in yaml.safe_load_all((d / patch["path"]).read_text()):
            patched[doc["kind"]] = doc["spec"]["template"]["spec"]["containers"][0]
    assert set(patched) == {"DaemonSet", "Deployment"}
    for c in patched.values():
        assert "--metrics-auth" in c["args"]
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_the_rendering_is_accepted_by_the_api_server_and_the_handler_stays_restricted(
    admin: client.ApiClient,
) -> None:
    """Strict server-side dry run of everything metricsAuth renders, and the handler pod
    (with its TLS Secret volume) still passes Pod Security "restricted"."""
    docs = render(
        AUTH,
        "metricsAuth.tlsSecret.agent=agent-metrics-tls",
        "metricsAuth.tlsSecret.handler=handler-metrics-tls",
        "metricsAuth.scrapers[0].namespace=monitoring",
        "metricsAuth.scrapers[0].name=prometheus",
    )
    applied = dry_run_apply(admin, docs)
    assert {("ClusterRole", n) for n in NAMES} <= set(applied)
    assert ("ClusterRoleBinding", "execwatch-metrics-reader") in applied
    ns = namespace_enforcing(admin, "restricted")
    create_pod_dry_run(admin, pod_of(find(docs, "Deployment", "execwatch-handler"), ns))
