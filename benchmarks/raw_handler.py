"""The baseline for the handler's throughput: a raw client doing the same calls per record.

    python -m benchmarks.raw_handler URL CA TOKEN NAMESPACE [--workers 16]
        [--transport http.client|httpx2]

Lists the ExecFailure records in NAMESPACE (paged), then with WORKERS threads, each on
its own keep-alive `http.client` connection, does per record exactly what the handler
does on its worst-case path: GET the pod (quorum read), POST a new Warning Event, PATCH
the pod's label when this run has not labelled it yet, DELETE the record with a UID
precondition. No validation, no metrics, no retries: the fastest honest client.
`--transport httpx2`: the same requests on one httpx2 pool (the handler's transport).
Prints one JSON line: records, seconds, records_per_s, cpu_s.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

GROUP, VERSION, PLURAL = "execwatch.io", "v1alpha1", "execfailures"


class Conn:
    def __init__(self, url: str, ca: str, token: str) -> None:
        u = urlparse(url)
        self.ctx = ssl.create_default_context(cafile=ca)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 443
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx)

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = ctype
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        payload = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {payload[:200]!r}")
        return json.loads(payload)


class HttpxConn(Conn):
    """`Conn` on a shared httpx2 pool (the handler's own transport, without the handler)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": ctype} if data is not None else {}
        resp = self.client.request(method, path, content=data, headers=headers)
        if resp.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.content[:200]!r}")
        return json.loads(resp.content)


def httpx_pool(args: argparse.Namespace) -> Any:
    import httpx2

    return httpx2.Client(
        base_url=args.url,
        verify=ssl.create_default_context(cafile=args.ca),
        headers={"Authorization": f"Bearer {args.token}", "Accept": "application/json"},
        limits=httpx2.Limits(max_connections=args.workers, max_keepalive_connections=args.workers),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("ca")
    ap.add_argument("token")
    ap.add_argument("namespace")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--transport", choices=["http.client", "httpx2"], default="http.client")
    args = ap.parse_args()
    shared = httpx_pool(args) if args.transport == "httpx2" else None
    local = threading.local()
    labelled: set[tuple[str, str]] = set()
    lock = threading.Lock()

    def conn() -> Conn:
        if not hasattr(local, "c"):
            local.c = HttpxConn(shared) if shared else Conn(args.url, args.ca, args.token)
        c: Conn = local.c
        return c

    def one(obj: dict[str, Any]) -> None:
        c = conn()
        spec, meta = obj["spec"], obj["metadata"]
        ns, pod_name = spec["pod"]["namespace"], spec["pod"]["name"]
        pod = c.call("GET", f"/api/v1/namespaces/{ns}/pods/{pod_name}")
        digest = hashlib.sha256(meta["uid"].encode()).hexdigest()[:16]
        c.call(
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": f"{pod_name}.raw-{digest}", "namespace": ns},
                "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000001Z", time.gmtime()),
                "reportingController": "execwatch.io/raw",
                "reportingInstance": "raw",
                "action": "Exec",
                "reason": "ExecFormatError",
                "regarding": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "namespace": ns,
                    "uid": pod["metadata"]["uid"],
                },
                "note": f"could not exec {spec['path']}",
                "type": "Warning",
            },
        )
        with lock:
            first = (ns, pod_name) not in labelled
            labelled.add((ns, pod_name))
        if first:
            c.call(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{pod_name}",
                {"metadata": {"labels": {"execwatch.io/exec-failure": "ExecFormatError"}}},
                "application/merge-patch+json",
            )
        c.call(
            "DELETE",
            f"/apis/{GROUP}/{VERSION}/namespaces/{args.namespace}/{PLURAL}/{meta['name']}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": meta["uid"]}},
        )

    cpu0, t0 = time.process_time(), time.monotonic()
    items: list[dict[str, Any]] = []
    lister, token = conn(), ""
    while True:
        page = lister.call(
            "GET",
            f"/apis/{GROUP}/{VERSION}/namespaces/{args.namespace}/{PLURAL}?limit=500"
            + (f"&continue={token}" if token else ""),
        )
        items += page["items"]
        token = page["metadata"].get("continue") or ""
        if not token:
            break
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(one, items))
    elapsed = time.monotonic() - t0
    print(
        json.dumps(
            {
                "records": len(items),
                "seconds": round(elapsed, 2),
                "records_per_s": round(len(items) / elapsed, 1),
                "cpu_s": round(time.process_time() - cpu0, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
