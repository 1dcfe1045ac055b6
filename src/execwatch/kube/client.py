"""The one Kubernetes client of execwatch: JSON requests on lightkube's configuration,
credentials and httpx2 transport.

Agent, handler, placement and audit all send plain JSON through this, and read answers as
plain JSON: no generated models (building them per answer costs the handler CPU it does
not need, and importing them costs the agent memory; docs/scaling.md's figures). From
lightkube it takes only what is hard to get right: kubeconfig and in-cluster
configuration, CA, client certificate and bearer token (the ServiceAccount token file is
re-read when the server answers 401, so in-cluster token rotation works). One httpx2
connection pool per client, and every failure classified by `errors`.

httpx2 sends each request once: a DELETE whose answer was lost surfaces as "no answer"
to the caller, which decides what it means, instead of being re-sent silently and
coming back 404. (The 401 re-send of the token-file auth is safe: the server did not act.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from execwatch.kube import errors

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
ERROR_BODY = 64 * 1024  # bytes of an error answer read for its Status


def path(*segments: str) -> str:
    """An API path from segments, each percent-encoded (names come from records)."""
    return "/" + "/".join(quote(s, safe="") for s in segments)


def load_config(kubeconfig: str | None = None) -> Any:
    """lightkube's KubeConfig: the given file, else in-cluster, else $KUBECONFIG or
    ~/.kube/config."""
    from lightkube import KubeConfig

    return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()


def config_for(server: str, ca_file: str, token: str) -> Any:
    """lightkube's KubeConfig for one server and bearer token (tests, benchmarks)."""
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


@dataclass
class Rest:
    """Requests with JSON bodies and answers on `kube` (a lightkube KubeConfig, at its
    `context`, default the current one), with `pool` connections kept open (one per
    concurrent caller: fewer pay a TLS handshake per request). More callers get more
    connections, never a wait for one."""

    kube: Any
    timeout: float = 10.0
    pool: int = 10
    context: str | None = None

    def __post_init__(self) -> None:
        import httpx2
        from lightkube.config.client_adapter import ConnectionParams

        params = ConnectionParams(timeout=httpx2.Timeout(self.timeout)).httpx_params(
            self.kube.get(self.context)
        )
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=self.pool)
        self._http = httpx2.Client(**params, limits=limits)
        self._timeout = httpx2.Timeout
        logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per request

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Rest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        url_path: str,
        query: Mapping[str, str | int] | None,
        body: Any,
        content_type: str,
        timeout: Any,
    ) -> Any:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Accept": JSON}
        if data is not None:
            headers["Content-Type"] = content_type
        return self._http.build_request(
            method, url_path, params=dict(query or {}), content=data, headers=headers,
            timeout=timeout,
        )  # fmt: skip

    def _send(self, request: Any, stream: bool) -> Any:
        with errors.translate():
            resp = self._http.send(request, stream=stream)
        if 200 <= resp.status_code < 300:
            return resp
        try:
            with errors.translate():
                raw = _head(resp) if stream else resp.content
        finally:
            resp.close()
        reason, message = errors.status_message(raw)
        raise errors.from_status(
            resp.status_code, reason or resp.reason_phrase, message, resp.headers
        )

    def call(
        self,
        method: str,
        url_path: str,
        *,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or an `errors.ApiError`."""
        t = self._timeout(timeout or self.timeout)
        resp = self._send(self._request(method, url_path, query, body, content_type, t), False)
        try:
            answer = json.loads(resp.content) if resp.content else {}
        except ValueError as exc:
            raise errors.RetryableError(resp.status_code, "BadJSON", str(exc)[:200]) from exc
        return answer if isinstance(answer, dict) else {}

    def stream(
        self, url_path: str, query: Mapping[str, str | int], timeout: tuple[float, float]
    ) -> Stream:
        """A GET whose body is read as it comes (a watch)."""
        t = self._timeout(timeout[1], connect=timeout[0])
        return Stream(self._send(self._request("GET", url_path, query, None, JSON, t), True))


def _head(resp: Any) -> bytes:
    out = b""
    for chunk in resp.iter_bytes():
        out += chunk
        if len(out) >= ERROR_BODY:
            break
    return out[:ERROR_BODY]


@dataclass
class Stream:
    """A streamed answer: its body in chunks, failures as `errors` kinds."""

    response: Any

    def chunks(self, size: int) -> Iterator[bytes]:
        """Each chunk as it arrives (at most `size` bytes: a watch event must not wait for
        the next ones to fill a buffer)."""
        with errors.translate():
            for chunk in self.response.iter_bytes():
                for start in range(0, len(chunk), size):
                    yield chunk[start : start + size]

    def close(self) -> None:
        self.response.close()

    def shutdown(self) -> None:
        """End a read blocked in another thread (a watch whose term is over)."""
        net = self.response.extensions.get("network_stream")
        sock = net.get_extra_info("socket") if net is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
