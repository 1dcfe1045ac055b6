"""The agent's Kubernetes API client: one create, and the optional node-scoped pod watch.

Agent, handler and audit use lightkube, not the official `kubernetes` client: release
36 of the official client imports its ~1000 generated models at once (66 MB of RSS for
the import alone), while lightkube's client, TLS and config cost ~15 MB and it covers
what the agent needs: in-cluster config with a rotated token file, kubeconfig, a create
of a custom resource, and a pod list + watch with a field selector (`attribution.kube`).
The handler and the audit send plain JSON on lightkube's configuration (`kube.client`).
Exceptions are translated into `kube.errors`, which alone decides what they mean.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from execwatch.kube import errors


def client(kubeconfig: str | None = None, timeout: float = 10.0) -> Any:
    """A lightkube Client: the given kubeconfig, else in-cluster, else $KUBECONFIG or
    ~/.kube/config. In-cluster, the ServiceAccount token file is re-read as the kubelet
    rotates it."""
    import httpx2
    from lightkube import Client, KubeConfig

    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per request
    return Client(config, timeout=httpx2.Timeout(timeout), field_manager="execwatch-agent")


def config_for(server: str, ca_file: str, token: str) -> Any:
    """A lightkube KubeConfig for one server and bearer token (tests, benchmarks)."""
    from lightkube import KubeConfig

    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    return KubeConfig.from_dict(doc)


def client_for(server: str, ca_file: str, token: str, timeout: float = 10.0) -> Any:
    """A lightkube Client for one server and bearer token (tests, benchmarks)."""
    import httpx2
    from lightkube import Client

    return Client(config_for(server, ca_file, token), timeout=httpx2.Timeout(timeout))


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """lightkube's and httpx2's exceptions as `errors.ApiError` kinds (`errors.classify`);
    a ValueError is an answer lightkube could not decode (a proxy's page)."""
    try:
        with errors.translate():
            yield
    except ValueError as exc:
        raise errors.RetryableError(0, "UndecodableAnswer", str(exc)[:256]) from None
