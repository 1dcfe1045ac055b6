"""Placement's least privilege, enforced by the real API server with exactly the chart's
rules (`helm template`): its RBAC, the ValidatingAdmissionPolicy on its pod patches, the
one on the RoleBindings that let it read pull secrets in opted-in namespaces only, and the
pre-delete Job's own ServiceAccount (docs/privileges.md, "Placement")."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from execwatch.kube.client import Rest
from execwatch.placement.access import NamespaceAccess, NotOptedIn
from execwatch.placement.affinity import narrowed_affinity
from execwatch.placement.controller import JSON_PATCH, VerdictUnavailable, ungate_patch
from execwatch.placement.pullsecrets import PullSecrets
from execwatch.placement.webhook import GATE, GATED_LABEL, GATED_VALUE, MODE_LABEL
from tests.placement.cluster import create_pod, namespace
from tests.placement.test_cli import chart, port
from tests.support.deploy.chart import Doc
from tests.support.kube.apiserver import KubeCluster
from tests.support.placement.chart_placement import NAME, NS
from tests.support.wait import wait_until

__all__ = ["chart", "port"]

RELEASE = f"{NAME}-release"
ROLE = f"{NAME}-pull-credentials"
TERMS = [  # two ORed required terms of the user's own
    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
]


def status(call: Callable[[], Any]) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def patch(api: client.ApiClient, pod: dict[str, Any], ops: list[dict[str, Any]]) -> int:
    """The status of a JSON patch of `pod`, as placement sends it."""
    meta = pod["metadata"]
    url = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    return status(lambda: api.call_api(
        url, "PATCH", body=ops, header_params={"Content-Type": JSON_PATCH},
        auth_settings=["BearerToken"], _preload_content=False,
    ))  # fmt: skip


def gated(admin: client.ApiClient, ns: str, **spec: Any) -> dict[str, Any]:
    """A pod as the webhook leaves it, with gates, labels, affinity and tolerations of
    its own."""
    meta = {"name": f"p-{uuid.uuid4().hex[:6]}", "labels": {"app": "web", GATED_LABEL: GATED_VALUE}}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                 {"nodeSelectorTerms": TERMS}}}  # fmt: skip
    return create_pod(admin, ns, metadata=meta, affinity=affinity,
                      tolerations=[{"key": "dedicated", "operator": "Exists"}],
                      schedulingGates=[{"name": "x.io/mine"}, {"name": GATE}], **spec)  # fmt: skip


@pytest.fixture(scope="module")
def tokens(chart: dict[str, Doc], kube: KubeCluster) -> dict[str, str]:
    return {who: kube.service_account_token(NS, who) for who in (NAME, RELEASE)}


@pytest.fixture
def placement(kube: KubeCluster, tokens: dict[str, str]) -> Iterator[client.ApiClient]:
    with kube.client(tokens[NAME]) as api:
        yield api


@pytest.fixture
def enforced(admin: client.ApiClient, placement: client.ApiClient) -> client.ApiClient:
    """Placement's client once the API server's policy informer has the pod policy."""
    probe = create_pod(admin, namespace(admin, None), metadata={"name": "probe"})
    ops = [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]
    wait_until(lambda: patch(placement, probe, ops) == 403, timeout=30)
    return placement


def test_placement_cannot_change_a_kube_system_pods_image(
    admin: client.ApiClient, enforced: client.ApiClient
) -> None:
    pod = create_pod(admin, "kube-system", metadata={"name": f"dns-{uuid.uuid4().hex[:6]}"})
    ops = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}]

    assert patch(enforced, pod, ops) == 403

    now = client.CoreV1Api(admin).read_namespaced_pod(pod["metadata"]["name"], "kube-system")
    assert now.spec.containers[0].image == "r.example/app:1"


def test_placement_may_narrow_and_ungate_a_gated_pod_as_the_controller_does(
    admin: client.ApiClient, enforced: client.ApiClient
) -> None:
    ns = namespace(admin, "enforce")
    placed, skipped = gated(admin, ns), gated(admin, ns)
    no_terms = create_pod(admin, ns, metadata={"name": "bare", "labels": {GATED_LABEL: "pending"}},
                          schedulingGates=[{"name": GATE}])  # fmt: skip

    narrowed = narrowed_affinity(placed["spec"], ["amd64"])
    assert patch(enforced, placed, ungate_patch(placed, narrowed)) == 200
    assert patch(enforced, skipped, ungate_patch(skipped, None)) == 200  # fail open
    nowhere = narrowed_affinity(no_terms["spec"], [])
    assert patch(enforced, no_terms, ungate_patch(no_terms, nowhere)) == 200


def changes(pod: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Patches of a gated pod that placement never makes, each with the ungate."""
    ungate = ungate_patch(pod, None)
    other = {"key": "zone", "operator": "In", "values": ["a"]}
    term = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    return {
        "an image": [*ungate, {"op": "replace", "path": "/spec/containers/0/image",
                               "value": "evil.example/x:1"}],
        "another label": [*ungate, {"op": "add", "path": "/metadata/labels/extra", "value": "x"}],
        "a label's value": [*ungate, {"op": "replace", "path": "/metadata/labels/app",
                                      "value": "db"}],
        "an annotation": [*ungate, {"op": "add", "path": "/metadata/annotations",
                                    "value": {"a": "b"}}],
        "a toleration": [*ungate, {"op": "add", "path": "/spec/tolerations/-",
                                   "value": {"operator": "Exists"}}],
        "another gate": [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        "a nodeSelector": [*ungate, {"op": "add", "path": "/spec/nodeSelector",
                                     "value": {"disk": "hdd"}}],
        "a requirement not on the architecture": [
            *ungate, {"op": "add", "path": f"{term}/nodeSelectorTerms/0/matchExpressions/-",
                      "value": other}],
    }  # fmt: skip


NEVER = [
    "an image",
    "another label",
    "a label's value",
    "an annotation",
    "a toleration",
    "another gate",
    "a nodeSelector",
    "a requirement not on the architecture",
]


@pytest.mark.parametrize("what", NEVER)
def test_placement_may_change_nothing_else_of_a_gated_pod(
    admin: client.ApiClient, enforced: client.ApiClient, what: str
) -> None:
    pod = gated(admin, namespace(admin, "enforce"))

    assert patch(enforced, pod, changes(pod)[what]) == 403

    now = client.CoreV1Api(admin).read_namespaced_pod(pod["metadata"]["name"],
                                                      pod["metadata"]["namespace"])  # fmt: skip
    assert [g.name for g in now.spec.scheduling_gates] == ["x.io/mine", GATE]


def secret_in(admin: client.ApiClient, ns: str) -> str:
    name = f"s-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(admin).create_namespaced_secret(
        ns, {"metadata": {"name": name}, "data": {"k": base64.b64encode(b"v").decode()}}
    )
    return name


def access(kube: KubeCluster, token: str) -> tuple[NamespaceAccess, Rest]:
    rest = Rest(kube.client_config(token))
    return NamespaceAccess(rest, ROLE, NS, NAME), rest


def test_placement_reads_secrets_only_in_namespaces_that_opted_in(
    kube: KubeCluster, admin: client.ApiClient, tokens: dict[str, str], placement: client.ApiClient
) -> None:
    """Before placement first judges a pod of a namespace it binds its pull-credentials
    role there (access.py); the API server admits that binding only where the namespace
    opted in, so no Secret of kube-system or of a plain namespace is ever readable."""
    core = client.CoreV1Api(placement)
    plain, opted = namespace(admin, None), namespace(admin, "enforce")
    secrets = {ns: secret_in(admin, ns) for ns in ("kube-system", plain, opted)}
    made, rest = access(kube, tokens[NAME])

    with rest:
        wait_until(lambda: policy_active(admin, made), timeout=30)
        made.ensure(opted)
        for ns in ("kube-system", plain):
            assert binding_refused(made, ns), ns
            assert read_secret(core, ns, secrets[ns]) == 403
        wait_until(lambda: read_secret(core, opted, secrets[opted]) == 200, timeout=10)
        assert status(lambda: core.list_namespaced_secret(opted)) == 403, "get only, never list"


def read_secret(core: client.CoreV1Api, ns: str, name: str) -> int:
    return status(lambda: core.read_namespaced_secret(name, ns))


def policy_active(admin: client.ApiClient, made: NamespaceAccess) -> bool:
    """The API server's policy informer has the binding policy: a binding in a plain
    namespace is refused (one made before is removed again)."""
    ns = namespace(admin, None, prefix="probe")
    if binding_refused(made, ns):
        return True
    client.RbacAuthorizationV1Api(admin).delete_namespaced_role_binding(ROLE, ns)
    made.forget(ns)
    return False


@pytest.mark.parametrize(
    "binding",
    [
        {"roleRef": {"kind": "ClusterRole", "name": "cluster-admin"}},
        {"roleRef": {"kind": "ClusterRole", "name": "edit"}},
        {"subjects": [{"kind": "Group", "name": "system:authenticated",
                       "apiGroup": "rbac.authorization.k8s.io"}]},
        {"subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}]},
        {"metadata": {"name": "another-name"}},
    ],
    ids=["cluster-admin", "edit", "everyone", "another account", "another name"],
)  # fmt: skip
def test_placement_can_make_no_other_binding(
    admin: client.ApiClient, placement: client.ApiClient, binding: dict[str, Any]
) -> None:
    ns = namespace(admin, "enforce")
    body: dict[str, Any] = {
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}],
    }
    for key, value in binding.items():
        body[key] = {**body[key], **value} if isinstance(value, dict) else value
    if "roleRef" in binding:
        body["roleRef"]["apiGroup"] = "rbac.authorization.k8s.io"
    rbac = client.RbacAuthorizationV1Api(placement)

    assert status(lambda: rbac.create_namespaced_role_binding(ns, body)) == 403


def binding_refused(made: NamespaceAccess, ns: str) -> bool:
    try:
        made.ensure(ns)
    except NotOptedIn:  # refused by the policy
        made.forget(ns)
        return True
    return False


def test_a_namespace_that_opts_out_loses_the_binding_at_the_leaders_sweep(
    kube: KubeCluster, admin: client.ApiClient, tokens: dict[str, str], placement: client.ApiClient
) -> None:
    ns = namespace(admin, "warn")
    secret = secret_in(admin, ns)
    made, rest = access(kube, tokens[NAME])
    core = client.CoreV1Api(placement)
    with rest:
        made.ensure(ns)
        wait_until(lambda: read_secret(core, ns, secret) == 200)
        client.CoreV1Api(admin).patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: None}}})

        assert made.sweep() >= 1

        wait_until(lambda: read_secret(core, ns, secret) == 403)


def test_a_replica_binds_again_when_a_namespace_opts_back_in(
    kube: KubeCluster, admin: client.ApiClient, tokens: dict[str, str]
) -> None:
    """Another replica (warn mode runs on every one) still believes the namespace bound
    after the leader's sweep: its failed read forgets that, and the next pod binds again."""
    ns = namespace(admin, "warn")
    pod = {"metadata": {"namespace": ns}, "spec": {"imagePullSecrets": [{"name": "pull"}]}}
    auths = {"auths": {"r.example": {"auth": base64.b64encode(b"u:p").decode()}}}
    client.CoreV1Api(admin).create_namespaced_secret(ns, {
        "metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(auths).encode()).decode()},
    })  # fmt: skip
    leader, rest = access(kube, tokens[NAME])
    other = NamespaceAccess(rest, ROLE, NS, NAME)
    with rest:
        assert PullSecrets(rest, other).configs(pod) == [auths]
        client.CoreV1Api(admin).patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: None}}})
        assert leader.sweep() >= 1
        client.CoreV1Api(admin).patch_namespace(ns, {"metadata": {"labels": {MODE_LABEL: "warn"}}})

        wait_until(lambda: configs_or_none(PullSecrets(rest, other), pod) == [auths])


def configs_or_none(secrets: PullSecrets, pod: dict[str, Any]) -> list[dict[str, Any]] | None:
    try:
        return secrets.configs(pod)
    except VerdictUnavailable:
        return None


RELEASE_DENIED = {
    "get a secret": lambda a: client.CoreV1Api(a).read_namespaced_secret(f"{NAME}-tls", NS),
    "get a pod": lambda a: client.CoreV1Api(a).read_namespaced_pod("p", NS),
    "bind a role": lambda a: client.RbacAuthorizationV1Api(a).create_namespaced_role_binding(
        NS, {"metadata": {"name": ROLE}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
             "kind": "ClusterRole", "name": ROLE}, "subjects": []}),
    "take the lease": lambda a: client.CoordinationV1Api(a).create_namespaced_lease(
        NS, {"metadata": {"name": NAME}}),
    "write a verdict": lambda a: client.CustomObjectsApi(a).create_cluster_custom_object(
        "execwatch.io", "v1alpha1", "imageverdicts", {"metadata": {"name": "x"}}),
    "list nodes": lambda a: client.CoreV1Api(a).list_node(),
    "patch the webhook": lambda a: client.AdmissionregistrationV1Api(
        a).patch_mutating_webhook_configuration(NAME, [{"op": "test", "path": "/kind",
                                                        "value": "x"}]),
    "delete another webhook": lambda a: client.AdmissionregistrationV1Api(
        a).delete_mutating_webhook_configuration("other"),
}  # fmt: skip


@pytest.mark.parametrize("what", list(RELEASE_DENIED))
def test_the_pre_delete_job_can_do_only_its_release(
    kube: KubeCluster, tokens: dict[str, str], what: str
) -> None:
    with kube.client(tokens[RELEASE]) as api:
        assert status(lambda: RELEASE_DENIED[what](api)) == 403, what


def test_the_pre_delete_job_cannot_change_an_ungated_pod(
    admin: client.ApiClient, enforced: client.ApiClient, kube: KubeCluster, tokens: dict[str, str]
) -> None:
    pod = create_pod(admin, namespace(admin, None))
    ops = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}]
    with kube.client(tokens[RELEASE]) as api:
        assert patch(api, pod, ops) == 403
        assert status(lambda: client.CoreV1Api(api).list_pod_for_all_namespaces(limit=1)) == 200
