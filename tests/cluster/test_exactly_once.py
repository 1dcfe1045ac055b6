"""Every failure counted exactly once through lost replies, refusals, resets and failover.

The agent's publisher and the handler replicas talk to the real kube-apiserver through
a fault-injecting proxy on loopback (tests/support/kube/faultproxy.py) that, at random, answers
429/500/503 itself, delays, resets connections before forwarding, and — the hard case —
forwards a write, lets the API server carry it out, then drops or resets the reply. The
Lease calls suffer too, and the leader is replaced several times during the run.

Afterwards: the handlers' metric total equals the failures caused, the Event series
counts add up to the same number, and no record is left.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from execwatch import crd
from execwatch.agent.publisher import Publisher, PublisherConfig
from execwatch.agent.records import RecordApi
from execwatch.handler.controller import Handler, HandlerConfig
from execwatch.kube.client import Rest, config_for
from tests.cluster.conftest import NODE, PodFactory, list_records
from tests.cluster.test_handler import events_of, failures_total, sample
from tests.cluster.test_node_binding import record
from tests.support.agent.exec_failures import exec_failure
from tests.support.kube.apiserver import KubeCluster
from tests.support.kube.apiserver_fixtures import AGENT_SA, HANDLER_SA
from tests.support.kube.faultproxy import FaultProxy
from tests.support.wait import wait_until

FAILURES_AT_LEAST = 1000


@pytest.fixture
def proxy(kube: KubeCluster) -> Iterator[FaultProxy]:
    pki = kube.workdir / "pki"
    p = FaultProxy(
        kube.port, pki / "serving.crt", pki / "serving.key", kube.ca, rate=0.3, seed=9
    ).start()
    yield p
    p.stop()


def via(kube: KubeCluster, proxy: FaultProxy, token: str) -> Any:
    """The handler's configuration, through the fault proxy."""
    return kube.client_config(token, server=proxy.url)


def sum_samples(handlers: list[Handler], name: str, **labels: str) -> float:
    return sum(sample(h, name, **labels) for h in handlers)


def test_counts_are_exact_through_injected_faults_and_leader_changes(
    kube: KubeCluster,
    admin: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    proxy: FaultProxy,
) -> None:
    pods = [make_pod(name=f"app-7d9f8b6c5d-{i:05d}") for i in range(12)]
    agent_token = kube.node_token(*AGENT_SA, NODE)
    handler_token = kube.service_account_token(*HANDLER_SA)
    handlers: list[Handler] = []

    def start_replica() -> Handler:
        h = Handler(
            HandlerConfig(
                identity=f"replica-{len(handlers)}",
                lease_duration=3.0,
                renew_deadline=2.0,
                retry_period=0.3,
                request_timeout=5.0,
                retry_initial=0.05,
                retry_max=0.5,
                workers=8,
            ),
            via(kube, proxy, handler_token),
        )
        h.start()
        handlers.append(h)
        return h

    publisher = Publisher(
        PublisherConfig(
            node=NODE,
            aggregation_window=0.3,
            rate=500,
            burst=200,
            spool_size=5000,
            backoff_initial=0.05,
            backoff_max=0.5,
        ),
        RecordApi(  # the agent's own client, through the proxy
            Rest(config_for(proxy.url, str(kube.ca), agent_token), timeout=5.0),
            crd.DEFAULT_NAMESPACE,
        ),
    )
    rng = random.Random(4)
    caused = 0
    live = [start_replica(), start_replica()]
    publisher.start()
    try:
        changes = 0
        while caused < FAILURES_AT_LEAST or changes < 4:
            for _ in range(20):
                n = rng.randint(1, 4)
                caused += n
                pod = rng.choice(pods)
                path = f"/usr/bin/tool-{rng.randint(0, 39)}"
                publisher.submit(exec_failure(pod=pod, path=path, count=n))
            time.sleep(0.3)
            leader = next((h for h in live if h.elector.is_leader()), None)
            if leader is not None and changes < 4 and caused > 250 * (changes + 1):
                leader.stop()  # a leader change in the middle of the stream
                live.remove(leader)
                live.append(start_replica())
                changes += 1
        wait_until(lambda: publisher.spooled() == 0, timeout=300)
        wait_until(lambda: not list_records(admin) and all(h.idle() for h in handlers), timeout=300)
    except BaseException:
        for h in handlers:  # what is stuck where
            print(h.config.identity, h.elector.is_leader(), len(h.queue), h.idle(), h._unsure)
        print("left", [r["metadata"]["name"] for r in list_records(admin)])
        raise
    finally:
        publisher.stop(flush_timeout=0)
        for h in handlers:
            h.stop()

    def series_total(events: list[Any]) -> int:
        return sum(int(e.series.count) if e.series else 1 for e in events)

    published = publisher.metrics.registry.get_sample_value(
        "execwatch_publisher_published_failures_total"
    )
    dropped = sum(
        publisher.metrics.registry.get_sample_value(
            "execwatch_publisher_dropped_total", {"type": t}
        )
        or 0.0
        for t in ("spool_full", "rejected")
    )
    counted = sum(failures_total(h, namespace=namespace) for h in handlers)
    records = sum_samples(handlers, "execwatch_handler_records_total", result="handled")
    print(
        f"failures={caused} records={records} faults={dict(proxy.faults)} "
        f"requests={proxy.requests} leader_changes={changes} replicas={len(handlers)}"
    )
    assert proxy.total() >= 300, proxy.faults
    assert proxy.faults["drop_reply"] + proxy.faults["reset_after"] >= 50
    assert changes == 4
    assert dropped == 0 and published == caused
    assert counted == caused
    assert series_total(events_of(admin, namespace)) == caused
    assert sum_samples(handlers, "execwatch_handler_records_total", result="unresolved") == 0
    assert not list_records(admin)


def test_a_lost_delete_reply_is_counted_once(
    kube: KubeCluster,
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    proxy: FaultProxy,
) -> None:
    """Every record delete is carried out by the API server and its reply dropped: the
    retry gets 404 (or the watch's DELETED comes first). Counted once, not zero times."""
    from tests.cluster.conftest import publish

    pod = make_pod()
    proxy.rate = 1.0
    proxy.select = lambda req: req.method == "DELETE"
    proxy.kinds = ("drop_reply",)
    handler = Handler(
        HandlerConfig(
            identity="lossy",
            lease_duration=4.0,
            renew_deadline=3.0,
            retry_period=0.5,
            retry_initial=0.05,
            retry_max=0.5,
        ),
        via(kube, proxy, kube.service_account_token(*HANDLER_SA)),
    )
    handler.start()
    try:
        for i in range(10):
            publish(agent_api, exec_failure(pod=pod, path=f"/bin/x{i}", count=3))
        wait_until(lambda: not list_records(admin) and handler.idle(), timeout=30)
    finally:
        handler.stop()
    assert proxy.faults["drop_reply"] >= 10
    assert failures_total(handler, namespace=namespace) == 30
    assert sample(handler, "execwatch_handler_records_total", result="handled") == 10


def test_a_label_patch_refused_by_another_webhook_is_counted_and_not_retried(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    make_pod: PodFactory,
    namespace: str,
    start_handler: Any,
) -> None:
    """Another admission policy forbids label changes in this namespace: 422 (or 403) is
    permanent, so the Event is posted, the label skipped, the failure counted."""
    from tests.cluster.conftest import publish

    policy = f"deny-labels-{namespace}"
    adm = client.AdmissionregistrationV1Api(admin)
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.metadata.?labels.orValue({}) == "
                        "oldObject.metadata.?labels.orValue({})",
                        "message": "labels are frozen here",
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        pod = make_pod()
        core = client.CoreV1Api(admin)

        def frozen() -> bool:
            try:
                core.patch_namespaced_pod(
                    pod["metadata"]["name"],
                    namespace,
                    {"metadata": {"labels": {"probe": str(time.monotonic_ns())}}},
                    _content_type="application/merge-patch+json",
                )
            except client.exceptions.ApiException as exc:
                return int(exc.status) in (403, 422)
            return False

        wait_until(frozen, timeout=15)
        handler = start_handler()
        publish(agent_api, exec_failure(pod=pod, count=4))
        wait_until(lambda: not list_records(admin) and handler.idle(), timeout=20)
        [event] = events_of(admin, namespace)
        assert event.series.count == 4
        assert failures_total(handler, namespace=namespace) == 4
        label_errors = [
            s
            for m in handler.metrics.registry.collect()
            for s in m.samples
            if s.name == "execwatch_handler_api_errors_total" and s.labels["verb"] == "label_pod"
        ]
        assert [int(s.value) for s in label_errors] == [1]  # refused once, never retried
    finally:
        adm.delete_validating_admission_policy_binding(policy)
        adm.delete_validating_admission_policy(policy)


def test_a_date_the_schema_allows_but_nothing_can_use_is_counted_invalid_once(
    admin: client.ApiClient,
    agent_api: client.ApiClient,
    start_handler: Any,
) -> None:
    body: dict[str, Any] = record(NODE)
    body["spec"]["firstSeen"] = body["spec"]["lastSeen"] = "0001-01-01T00:00:00+14:00"
    client.CustomObjectsApi(agent_api).create_namespaced_custom_object(
        crd.GROUP, crd.VERSION, crd.DEFAULT_NAMESPACE, crd.PLURAL, body
    )  # the schema takes it
    handler = start_handler()
    wait_until(lambda: not list_records(admin) and handler.idle(), timeout=15)
    assert sample(handler, "execwatch_handler_invalid_records_total", type="malformed") == 1
    assert sample(handler, "execwatch_handler_records_total", result="invalid") == 1


def test_rest_never_retries_on_its_own(kube: KubeCluster, proxy: FaultProxy) -> None:
    """A request whose reply is lost surfaces as 'no answer' (a client that re-sent it
    would report, for a DELETE, the 404 of its own earlier success)."""
    from execwatch.kube import errors

    proxy.rate = 1.0
    proxy.kinds = ("drop_reply",)
    rest = Rest(via(kube, proxy, kube.service_account_token(*HANDLER_SA)))
    with rest, pytest.raises(errors.RetryableError) as err:
        rest.call("GET", "/api/v1/namespaces/execwatch")
    assert err.value.status == 0 and err.value.may_have_acted
    assert proxy.requests == 1


def test_the_api_servers_own_429s_never_stop_the_publisher(
    kube: KubeCluster, admin: client.ApiClient, make_pod: PodFactory
) -> None:
    """Half of the agent's creates answered as kube-apiserver's priority-and-fairness filter
    rejects a request (429, Retry-After, a text/plain body, not a Status): every record is
    created once, none is dropped, the publishing thread lives on."""
    pki = kube.workdir / "pki"
    proxy = FaultProxy(
        kube.port, pki / "serving.crt", pki / "serving.key", kube.ca, rate=0.5, seed=3,
        kinds=("refuse_429_apf",), select=lambda req: req.method == "POST",
    ).start()  # fmt: skip
    pod = make_pod(name="app-7d9f8b6c5d-apf00")
    publisher = Publisher(
        PublisherConfig(node=NODE, aggregation_window=0.2, rate=500, burst=200,
                        backoff_initial=0.05, backoff_max=0.5),
        RecordApi(
            Rest(config_for(proxy.url, str(kube.ca), kube.node_token(*AGENT_SA, NODE))),
            crd.DEFAULT_NAMESPACE,
        ),
    )  # fmt: skip
    publisher.start()
    try:
        for i in range(40):
            publisher.submit(exec_failure(pod=pod, path=f"/usr/bin/tool-{i}"))
        wait_until(lambda: len(list_records(admin)) >= 40, timeout=120)
    finally:
        publisher.stop(flush_timeout=30)
        proxy.stop()
    assert proxy.faults["refuse_429_apf"] >= 10
    assert len(list_records(admin)) == 40
    assert publisher.metrics.registry.get_sample_value(
        "execwatch_publisher_dropped_total", {"type": "rejected"}
    ) in (None, 0.0)
