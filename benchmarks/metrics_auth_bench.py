"""What `--metrics-auth` costs a scrape, on a real kube-apiserver + etcd.

    .venv/bin/python -m benchmarks.metrics_auth_bench [--tokens 20] [--scrapes 200]

The real metrics server over TLS, guarded by `serving.metricsauth.MetricsAuth` with the
agent's ServiceAccount token and the shipped RBAC (deploy/base/optional/metrics-auth.yaml).
A scraper ServiceAccount bound to `get /metrics` scrapes it (a new TCP + TLS connection
each time, as Prometheus does with `Connection: close`): the first scrape of each of
`--tokens` fresh tokens (a TokenReview and a SubjectAccessReview), then `--scrapes`
scrapes answered from the cache, then as many from the same server without the guard.
Medians in milliseconds.
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client
from prometheus_client import CollectorRegistry

from execwatch.serving.exposition import serve
from execwatch.serving.metricsauth import AuthMetrics, MetricsAuth, tls_context

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.kube.apiserver import ensure_namespace, load_manifests, running_cluster  # noqa: E402

RBAC = "rbac.authorization.k8s.io"


def scrape(port: int, token: str) -> float:
    """Milliseconds for one scrape on a new connection; fails unless it is a 200."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    began = time.perf_counter()
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
    answer = conn.getresponse()
    answer.read()
    conn.close()
    if answer.status != 200:
        raise SystemExit(f"scrape answered {answer.status}")
    return (time.perf_counter() - began) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_cluster(Path(tmp) / "kube") as kube:
        kube.apply(load_manifests())
        kube.apply(load_manifests(REPO / "deploy" / "base" / "optional"))
        with kube.client() as api:
            ensure_namespace(api, "monitoring")
            core = client.CoreV1Api(api)
            core.create_namespaced_service_account("monitoring", {"metadata": {"name": "p"}})
        role = {"apiGroup": RBAC, "kind": "ClusterRole", "name": "reader"}
        kube.apply(
            [
                {
                    "apiVersion": f"{RBAC}/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": "reader"},
                    "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
                },
                {
                    "apiVersion": f"{RBAC}/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "reader"},
                    "roleRef": role,
                    "subjects": [
                        {"kind": "ServiceAccount", "name": "p", "namespace": "monitoring"}
                    ],
                },
            ]
        )
        agent = kube.rest(kube.node_token("execwatch", "execwatch-agent", "node-a"))
        registry = CollectorRegistry()
        auth = MetricsAuth(agent, registry)
        tls = tls_context(None, None, ["localhost"])
        guarded = serve(("127.0.0.1", 0), registry, None, guard=auth.answer, tls=tls)
        unguarded = CollectorRegistry()
        AuthMetrics(unguarded)  # the same series, so the same body size
        plain = serve(("127.0.0.1", 0), unguarded, None, tls=tls)
        try:
            tokens = [kube.service_account_token("monitoring", "p") for _ in range(args.tokens)]
            first = [scrape(guarded.server_port, t) for t in tokens]
            cached = [scrape(guarded.server_port, tokens[0]) for _ in range(args.scrapes)]
            bare = [scrape(plain.server_port, tokens[0]) for _ in range(args.scrapes)]
        finally:
            guarded.shutdown()
            plain.shutdown()
            auth.close()
    print(f"first scrape of a token (2 reviews): median {statistics.median(first):.1f} ms")
    print(f"cached: median {statistics.median(cached):.1f} ms")
    print(f"unguarded, same TLS: median {statistics.median(bare):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
