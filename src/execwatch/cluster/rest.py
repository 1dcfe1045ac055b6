"""JSON requests on the official client's connection pool and credentials, minus its cost.

The handler's hot path is four small requests per record. Through the generated client
each one costs ~0.6 ms of client CPU in parameter validation, model sanitising and
header building (measured: benchmarks/cluster_bench.py, `raw` against `handler`); the
same request on the client's own urllib3 pool costs a fraction of that. So the hot path
uses this: the same TLS settings, CA, client certificate, proxy and bearer token
(re-read through the client's refresh hook, so in-cluster token rotation still works),
and every failure classified by `errors`.

urllib3's own retries are off (`retries=False`): a DELETE whose answer was lost must
surface as "no answer" to the caller, which decides what it means, instead of being
re-sent silently and coming back 404.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from execwatch.cluster import errors

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


def path(*segments: str) -> str:
    """An API path from segments, each percent-encoded (names come from records)."""
    return "/" + "/".join(quote(s, safe="") for s in segments)


@dataclass
class Rest:
    """Requests with JSON bodies and answers; `api_client` is a kubernetes.client.ApiClient."""

    api_client: Any
    timeout: float = 10.0

    def __post_init__(self) -> None:
        cfg = self.api_client.configuration
        self._config = cfg
        self._base = str(cfg.host).rstrip("/")
        self._pool = self.api_client.rest_client.pool_manager
        self._static = {**self.api_client.default_headers, "Accept": JSON}

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = dict(self._static)
        auth = self._config.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _send(
        self,
        method: str,
        url_path: str,
        query: Mapping[str, str | int] | None,
        body: Any,
        content_type: str | None,
        timeout: Any,
        preload: bool,
    ) -> Any:
        url = self._base + url_path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            resp = self._pool.request(
                method,
                url,
                body=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=timeout,
                preload_content=preload,
                retries=False,
            )
        except Exception as exc:
            raise errors.classify(exc) from exc
        if not 200 <= resp.status < 300:
            raw = resp.data if preload else resp.read(64 * 1024)
            reason, message = errors.status_message(raw)
            raise errors.from_status(resp.status, reason or str(resp.reason), message, resp.headers)
        return resp

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
        resp = self._send(
            method, url_path, query, body, content_type, timeout or self.timeout, preload=True
        )
        try:
            answer = json.loads(resp.data) if resp.data else {}
        except ValueError as exc:
            raise errors.RetryableError(resp.status, "BadJSON", str(exc)[:200]) from exc
        return answer if isinstance(answer, dict) else {}

    def stream(
        self, url_path: str, query: Mapping[str, str | int], timeout: tuple[float, float]
    ) -> Any:
        """A GET whose body is read as it comes (a watch): the urllib3 response."""
        import urllib3

        t = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        return self._send("GET", url_path, query, None, None, t, preload=False)
