"""The handler turns each record into a Warning Event, a pod label and a metric, then
deletes it: against a real API server, as the handler's own ServiceAccount."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from execwatch import crd
from execwatch.handler.controller import Handler, HandlerConfig, Retry
from execwatch.handler.pod_events import RECORDS_ANNOTATION
from execwatch.kube.safe import is_label_value
from execwatch.record import AttributionStatus, ExecFailure, Reason
from tests.cluster.conftest import (
    NODE,
    Deliver,
    PodFactory,
    drained,
    label_of,
    list_records,
    publish,
)
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import HANDLER_SA
from tests.support.wait import wait_until

StartHandler = Callable[..., Handler]


def events_of(admin: client.ApiClient, namespace: str) -> list[Any]:
    return list(client.EventsV1Api(admin).list_namespaced_event(namespace).items)


def failures_total(h: Handler, **labels: str) -> float:
    total = 0.0
    for metric in h.metrics.registry.collect():
        if metric.name != "execwatch_exec_failures":
            continue
        for s in metric.samples:
            if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def sample(h: Handler, name: str, **labels: str) -> float:
    return h.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_record_becomes_a_warning_event_a_pod_label_and_a_metric(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    deliver(handler, exec_failure(pod=pod, count=3))

    [event] = events_of(admin, namespace)
    assert event.type == "Warning" and event.reason == "ExecFormatError"
    assert event.reporting_controller == "execwatch.io/handler"
    assert event.regarding.uid == pod["metadata"]["uid"]
    assert event.regarding.field_path == "spec.containers{app}"
    assert "/usr/local/bin/server" in event.note
    assert "arm64 binary on a amd64 node" in event.note and 'container "app"' in event.note
    assert event.series.count == 3
    assert label_of(admin, pod) == "ExecFormatError"
    assert (
        failures_total(
            handler,
            namespace=namespace,
            workload="app",
            container="app",
            node=NODE,
            node_arch="amd64",
            binary_arch="arm64",
            reason="ForeignArchitecture",
        )
        == 3
    )
    assert sample(handler, "execwatch_handler_records_total", result="handled") == 1


def test_a_crash_loop_is_one_event_whose_series_grows(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    for n in (1, 4, 10):
        deliver(handler, exec_failure(pod=pod, count=n))
    [event] = events_of(admin, namespace)
    assert event.series.count == 15
    assert len(json.loads(event.metadata.annotations[RECORDS_ANNOTATION])) == 3
    assert failures_total(handler, namespace=namespace) == 15


def test_a_missing_interpreter_gets_its_own_reason(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    deliver(
        handler,
        exec_failure(
            pod=pod,
            reason=Reason.MISSING_INTERPRETER,
            err=2,
            binary_arch="amd64",
            path="/usr/local/bin/oberon-runner",
        ),
    )
    [event] = events_of(admin, namespace)
    assert event.reason == "MissingInterpreter" and "(ENOENT)" in event.note
    assert label_of(admin, pod) == "MissingInterpreter"


def test_an_undiagnosed_failure_labels_a_pod_but_never_hides_a_diagnosed_reason(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    deliver: Deliver,
    namespace: str,
) -> None:
    def undiagnosed(pod: dict[str, Any]) -> ExecFailure:
        return exec_failure(pod=pod, reason=Reason.UNDIAGNOSED, binary_arch=None)

    crashing, unknown = make_pod(), make_pod(name="app-7d9f8b6c5d-y3y5l")
    handler = start_handler()
    deliver(handler, exec_failure(pod=crashing))
    publish(agent_api, undiagnosed(crashing))
    publish(agent_api, undiagnosed(unknown))
    wait_until(drained(admin, handler))
    assert label_of(admin, crashing) == "ExecFormatError"
    assert label_of(admin, unknown) == "ExecFailed"
    assert failures_total(handler, namespace=namespace, reason="Undiagnosed") == 2


def test_a_record_for_a_pod_that_does_not_exist_is_counted_but_not_believed(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    """1,000 failures for an invented payments/checkout must not show up as that
    workload's failures: the namespace and workload are only the record's word."""
    publish(
        agent_api,
        exec_failure(pod_name="checkout-0", namespace="payments", pod_uid="u-forged"),
        count=1000,
    )
    deliver(handler, exec_failure(pod_name="gone-0", namespace=namespace, pod_uid="u-gone"))
    assert events_of(admin, namespace) == []
    assert failures_total(handler) == 0
    assert (
        sample(
            handler,
            "execwatch_handler_unattributed_total",
            node=NODE,
            node_arch="amd64",
            reason="ForeignArchitecture",
            type="pod_missing",
        )
        == 1001
    )
    assert sample(handler, "execwatch_handler_records_total", result="pod_missing") == 2


def test_a_failure_in_a_namespace_deleted_meanwhile_is_counted_without_an_event(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    """The pod was seen, then its namespace went away: an Event can never be created
    there (404), so the handler skips it and counts the failure, instead of retrying
    the record forever."""
    wait_until(handler.elector.is_leader)
    core = client.CoreV1Api(admin)
    core.delete_namespace(namespace)
    # No namespace controller runs here: empty its finalizers, as it would when done.
    core.replace_namespace_finalize(
        namespace, client.V1Namespace(metadata={"name": namespace}, spec={"finalizers": []})
    )
    wait_until(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items})
    deliver(handler, exec_failure(pod=pod, count=2))
    assert failures_total(handler, namespace=namespace, reason="ForeignArchitecture") == 2
    assert sample(handler, "execwatch_handler_records_total", result="handled") == 1
    assert sample(handler, "execwatch_handler_api_errors_total", verb="event", code="404") == 1


def test_a_pod_recreated_under_the_same_name_is_not_blamed(
    admin: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    deliver: Deliver,
    namespace: str,
) -> None:
    pod = make_pod(name="db-0", deployment=None)
    handler = start_handler()
    deliver(handler, exec_failure(pod=pod, pod_uid="uid-of-the-previous-db-0"))
    assert events_of(admin, namespace) == []
    assert label_of(admin, pod) is None
    assert sample(handler, "execwatch_handler_records_total", result="pod_missing") == 1


def test_an_agent_cannot_speak_for_pods_on_another_node(
    admin: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    deliver: Deliver,
    namespace: str,
) -> None:
    pod = make_pod(node="node-b")
    handler = start_handler()
    deliver(handler, exec_failure(pod=pod), node=NODE)
    assert events_of(admin, namespace) == []
    assert label_of(admin, pod) is None
    assert sample(handler, "execwatch_handler_invalid_records_total", type="node_mismatch") == 1
    assert failures_total(handler) == 0


def test_unattributed_failures_have_their_own_counter(
    handler: Handler,
    deliver: Deliver,
) -> None:
    deliver(handler, exec_failure(status=AttributionStatus.HOST, count=2))
    assert (
        sample(
            handler,
            "execwatch_handler_unattributed_total",
            node=NODE,
            node_arch="amd64",
            reason="ForeignArchitecture",
            type="no_pod",
        )
        == 2
    )
    assert failures_total(handler) == 0


def test_hostile_strings_stay_safe_in_events_labels_metrics_and_logs(
    admin: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    deliver: Deliver,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod = make_pod(containers=("app",))
    hostile = "/tmp/x\nlevel=error msg=forged\x1b[31m\u202e" + "d" * 4000
    caplog.set_level(logging.INFO)
    handler = start_handler()
    deliver(handler, exec_failure(pod=pod, path=hostile[:4000], comm="a\nb"))
    [event] = events_of(admin, namespace)
    assert "\n" not in event.note and "\x1b" not in event.note and "\u202e" not in event.note
    assert "\\x0alevel=error" in event.note and len(event.note) <= 1024
    label = label_of(admin, pod)
    assert label is not None and is_label_value(label)
    for record in caplog.records:
        assert "\n" not in record.getMessage()
        for value in getattr(record, "kv", {}).values():
            assert "\n" not in str(value) and "\x1b" not in str(value)
    assert failures_total(handler, namespace=namespace) == 1


def test_a_record_seen_again_after_a_crash_is_not_counted_twice(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler dies after posting the Event but before deleting the record: the next
    leader sees the same record again. The Event must not grow and the metric count once."""
    pod = make_pod()
    first = start_handler(identity="crashing")
    wait_until(first.elector.is_leader)
    first.stop()  # drive handle() by hand below, as the crashed replica
    first.elector.leading.set()
    first.elector._renewed_at = first.clock()
    name = publish(agent_api, exec_failure(pod=pod, count=5))
    [obj] = list_records(admin)

    def crash(*_: Any) -> bool:
        raise Retry("process killed before the delete")

    with monkeypatch.context() as m:
        m.setattr(first, "_finish", crash)
        with pytest.raises(Retry):
            first.handle(obj)
    [event] = events_of(admin, namespace)
    assert event.series.count == 5
    assert failures_total(first, namespace=namespace) == 0

    second = start_handler(identity="successor")
    wait_until(drained(admin, second))
    [event] = events_of(admin, namespace)
    assert event.series.count == 5
    assert failures_total(second, namespace=namespace) == 5
    assert name not in [r["metadata"]["name"] for r in list_records(admin)]


def test_a_record_recreated_by_an_agent_retry_is_not_counted_again(
    admin: client.ApiClient,
    pod: dict[str, Any],
    handler: Handler,
    deliver: Deliver,
    namespace: str,
) -> None:
    """The agent's create succeeded but its answer was lost; it retried after the handler
    had already handled and deleted the record, so the same name comes back with a new
    UID. It is the same failure: deleted, counted as a duplicate, not as a failure."""
    failure = exec_failure(pod=pod, count=2)
    name = deliver(handler, failure)
    deliver(handler, failure, name=name)
    wait_until(lambda: sample(handler, "execwatch_handler_records_total", result="duplicate"))
    [event] = events_of(admin, namespace)
    assert event.series.count == 2
    assert failures_total(handler, namespace=namespace) == 2


def test_the_cardinality_guard_folds_new_series_into_other(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    namespace: str,
) -> None:
    pods = [make_pod(name=f"p{i}", deployment=f"app{i}") for i in range(4)]
    handler = start_handler(max_series=2)
    for p in pods:
        publish(agent_api, exec_failure(pod=p))
    wait_until(drained(admin, handler))
    assert failures_total(handler, namespace=namespace) == 2
    assert (
        failures_total(handler, namespace="_other", workload="_other", reason="ForeignArchitecture")
        == 2
    )
    assert sample(handler, "execwatch_handler_series_overflow_total") == 2


def test_two_replicas_one_leader_each_record_counted_once(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    namespace: str,
) -> None:
    pod = make_pod()
    a, b = start_handler(identity="a"), start_handler(identity="b")
    wait_until(lambda: a.elector.is_leader() or b.elector.is_leader())
    for _ in range(20):
        publish(agent_api, exec_failure(pod=pod))
    wait_until(drained(admin, a, b))
    assert a.elector.is_leader() != b.elector.is_leader()
    assert failures_total(a) + failures_total(b) == 20
    follower = b if a.elector.is_leader() else a
    assert follower.handled == 0
    [event] = events_of(admin, namespace)
    assert event.series.count == 20


def test_records_naming_namespaces_the_handler_cannot_see_are_invalid(
    kube: KubeCluster,
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
) -> None:
    """A handler installed with namespace-scoped rights (RoleBindings instead of the
    ClusterRoleBinding) meets a record for a pod outside them: it is not retried forever,
    it is dropped as invalid, and pods it may see are still handled."""
    rbac, core = client.RbacAuthorizationV1Api(admin), client.CoreV1Api(admin)
    sa = f"scoped-handler-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account(crd.DEFAULT_NAMESPACE, {"metadata": {"name": sa}})
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": crd.DEFAULT_NAMESPACE}]
    visible = f"visible-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": visible}})
    for ns, kind, role in (
        (crd.DEFAULT_NAMESPACE, "Role", "execwatch-handler"),
        (visible, "ClusterRole", "execwatch-handler"),
    ):
        rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": sa},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": subject,
            },
        )
    hidden_pod = make_pod(name="hidden-0")  # in `namespace`, which the scoped SA cannot see
    seen_pod = core.create_namespaced_pod(
        visible,
        {
            "metadata": {"name": "seen-0"},
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "app:1"}]},
        },
    )
    handler = Handler(
        HandlerConfig(identity="scoped", lease_duration=4.0, renew_deadline=3.0, retry_period=0.5),
        kube.client_config(kube.service_account_token(crd.DEFAULT_NAMESPACE, sa)),
    )
    handler.start()
    try:
        publish(agent_api, exec_failure(pod=hidden_pod))
        publish(agent_api, exec_failure(pod=admin.sanitize_for_serialization(seen_pod)))
        wait_until(drained(admin, handler))
    finally:
        handler.stop()
    assert sample(handler, "execwatch_handler_invalid_records_total", type="pod_forbidden") == 1
    assert failures_total(handler, namespace=visible) == 1
    assert events_of(admin, namespace) == [] and len(events_of(admin, visible)) == 1


def test_a_backlog_found_at_start_is_listed_in_pages_and_all_handled(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    namespace: str,
) -> None:
    pod = make_pod()
    for i in range(7):
        publish(agent_api, exec_failure(pod=pod, path=f"/bin/backlog-{i}"))
    handler = start_handler(list_page=3)
    wait_until(drained(admin, handler))
    assert failures_total(handler, namespace=namespace) == 7
    assert len(events_of(admin, namespace)) == 7


def test_a_rotated_token_file_is_read_again_without_a_restart(
    kube: KubeCluster, tmp_path: Path
) -> None:
    """In-cluster, the kubelet rewrites the ServiceAccount token file: the handler's client
    answers a 401 by reading the file again and sending the request once more."""
    from lightkube import KubeConfig

    from execwatch.kube import errors
    from execwatch.kube.client import Rest

    token_file = tmp_path / "token"
    token_file.write_text("not-a-token")
    doc = {
        "clusters": [{"name": "c", "cluster": {"server": kube.url,
                                               "certificate-authority": str(kube.ca)}}],
        "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }  # fmt: skip
    with Rest(KubeConfig.from_dict(doc)) as rest:
        with pytest.raises(errors.RetryableError) as err:
            rest.call("GET", "/api")
        assert err.value.status == 401
        token_file.write_text(kube.service_account_token(*HANDLER_SA))
        assert rest.call("GET", "/api")["kind"] == "APIVersions"


# -- placement feedback (--placement-feedback) -------------------------------------------

IMAGE_VERDICT_CRD = Path(__file__).resolve().parents[2] / "deploy/placement/imageverdict-crd.yaml"
# What the handler's ServiceAccount gets for placement feedback (the chart's and the
# placement component's rules).
FEEDBACK_RBAC = Path(__file__).resolve().parents[2] / "deploy/base/optional/placement-feedback.yaml"


def placement_feedback_rules() -> list[dict[str, Any]]:
    import yaml

    role = next(
        d for d in yaml.safe_load_all(FEEDBACK_RBAC.read_text()) if d["kind"] == "ClusterRole"
    )
    return list(role["rules"])


@pytest.fixture
def feedback_rbac(admin: client.ApiClient) -> Any:
    import yaml

    from tests.support.kube.apiserver import apply

    apply(admin, [yaml.safe_load(IMAGE_VERDICT_CRD.read_text())])
    rbac = client.RbacAuthorizationV1Api(admin)
    name = f"execwatch-handler-placement-{uuid.uuid4().hex[:6]}"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": placement_feedback_rules()})
    subject = {"kind": "ServiceAccount", "name": HANDLER_SA[1], "namespace": HANDLER_SA[0]}
    rbac.create_cluster_role_binding({
        "metadata": {"name": name}, "subjects": [subject],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
    })  # fmt: skip
    yield
    rbac.delete_cluster_role_binding(name)
    rbac.delete_cluster_role(name)


def test_with_placement_feedback_a_platform_failure_becomes_a_sighting(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: StartHandler,
    make_pod: PodFactory,
    namespace: str,
    feedback_rbac: None,
) -> None:
    digest = "sha256:" + "5e" * 32
    opted_in = {"metadata": {"labels": {"execwatch.io/placement": "enforce"}}}
    client.CoreV1Api(admin).patch_namespace(namespace, opted_in)  # only these feed placement
    pod = make_pod()
    meta = pod["metadata"]
    pulled = {"name": "app", "imageID": f"registry.example/app@{digest}"}  # merged by name
    client.CoreV1Api(admin).patch_namespaced_pod_status(
        meta["name"], namespace, {"status": {"containerStatuses": [pulled]}}
    )
    handler = start_handler(feedback=True)

    publish(agent_api, exec_failure(pod=pod, count=2))  # arm64 binary on an amd64 node
    publish(agent_api, exec_failure(pod=pod, reason=Reason.MISSING_LIBRARY, path="/bin/x"))
    wait_until(drained(admin, handler))

    got = client.CustomObjectsApi(admin).get_cluster_custom_object(
        "execwatch.io", "v1alpha1", "imageverdicts", digest.replace(":", "-")
    )
    assert "platforms" not in got["status"] or got["status"]["platforms"] == []
    [seen] = got["status"]["observed"]
    assert (seen["platform"], seen["namespace"], seen["path"]) == (
        "linux/amd64",
        namespace,
        "/usr/local/bin/server",
    )
    assert seen["why"].startswith("ForeignArchitecture: /usr/local/bin/server")
    assert (
        sample(handler, "execwatch_verdict_writes_total", source="observed", result="written") == 1
    )
    client.CustomObjectsApi(admin).delete_cluster_custom_object(
        "execwatch.io", "v1alpha1", "imageverdicts", got["metadata"]["name"]
    )
