"""Authenticated /metrics: a bearer token, a TokenReview, then a SubjectAccessReview.

What controller-runtime's `filters.WithAuthenticationAndAuthorization` and kube-rbac-proxy
do, on execwatch's bounded server. Every scrape carries `Authorization: Bearer <token>`;
the API server says who the token belongs to (TokenReview, authentication.k8s.io/v1) and
whether that identity may `get` the non-resource URL /metrics (SubjectAccessReview,
authorization.k8s.io/v1), the one path metrics are served on: every other path is 404
before any review, so a right every user has (`get /version`, `/livez`: the built-in
discovery roles) never reads the metrics. No or an invalid token: 401; not allowed: 403.
/healthz stays open (the kubelet's probes carry no token).

The reviews never hold up the server's loop: they run on at most `max_inflight` worker
threads (concurrent scrapes with one token share one review), and the answer is
`Deferred` with a deadline of `budget` seconds. An API server that is down, slow, or
refuses the reviews gives 503, never a hang; with every review slot busy, 503 at once.
Answers are cached by a digest of the token (never the token) for `allow_ttl` or
`deny_ttl` seconds, at most `max_entries` of them; failures are never cached. Every scrape
is counted once in execwatch_metrics_auth_requests_total, by result.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from cachetools import TLRUCache
from prometheus_client import CollectorRegistry, Counter

from execwatch.kube import errors
from execwatch.serving.exposition import METRICS_PATH
from execwatch.serving.http import Deferred, Request, response
from execwatch.text import one_line

log = logging.getLogger(__name__)


class AccessVerdict(StrEnum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # no token, or the API server does not know it
    FORBIDDEN = "forbidden"  # a known identity without `get` on the path
    TIMEOUT = "timeout"  # no answer within the budget
    ERROR = "error"  # the API server unreachable, or refusing the review itself
    BUSY = "busy"  # every review slot taken


_STATUS = {
    AccessVerdict.UNAUTHENTICATED: ("401 Unauthorized", (("WWW-Authenticate", "Bearer"),)),
    AccessVerdict.FORBIDDEN: ("403 Forbidden", ()),
}
_UNAVAILABLE = ("503 Service Unavailable", (("Retry-After", "5"),))
_FINAL = (
    AccessVerdict.ALLOWED,
    AccessVerdict.UNAUTHENTICATED,
    AccessVerdict.FORBIDDEN,
)  # cacheable


@dataclass(frozen=True)
class AuthConfig:
    budget: float = 3.0  # seconds for both reviews of one scrape
    allow_ttl: float = 60.0  # controller-runtime: 1 min for tokens, 5 min for allows
    deny_ttl: float = 10.0  # short: a newly bound scraper is let in soon
    max_entries: int = 1024
    max_inflight: int = 4
    audiences: tuple[str, ...] = ()  # the token must be for one of these (empty: the API's)


@dataclass(frozen=True)
class Identity:
    user: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]


TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Reviews:
    """The two review calls, through the component's client (`kube.client.Rest`)."""

    def __init__(self, api: Any, audiences: tuple[str, ...]) -> None:
        self._api = api
        self._audiences = audiences

    def identity(self, token: str) -> Identity | None:
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = list(self._audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = self._api.call("POST", TOKEN_REVIEWS, body=body).get("status") or {}
        user = status.get("user")
        if not status.get("authenticated") or not isinstance(user, dict):
            return None
        if self._audiences and not set(status.get("audiences") or ()) & set(self._audiences):
            return None
        extra = {str(k): [str(x) for x in v] for k, v in (user.get("extra") or {}).items()}
        groups = tuple(str(g) for g in user.get("groups") or ())
        return Identity(str(user.get("username") or ""), str(user.get("uid") or ""), groups, extra)

    def allowed(self, who: Identity, path: str) -> bool:
        spec: dict[str, Any] = {
            "user": who.user,
            "groups": list(who.groups),
            "nonResourceAttributes": {"path": path, "verb": "get"},
        }
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = who.extra
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        status = self._api.call("POST", ACCESS_REVIEWS, body=body).get("status") or {}
        return status.get("allowed") is True


@dataclass
class AuthMetrics:
    registry: CollectorRegistry

    def __post_init__(self) -> None:
        self.requests = Counter(
            "execwatch_metrics_auth_requests",
            "Scrapes of an authenticated metrics endpoint, by result: allowed, "
            "unauthenticated (401), forbidden (403), and 503s: timeout (no review within the "
            "budget), error (API server unreachable or refusing), busy (review slots full).",
            ["result"],
            registry=self.registry,
        )
        self.reviews = Counter(
            "execwatch_metrics_auth_reviews",
            "TokenReview (type=token) and SubjectAccessReview (type=access) calls made.",
            ["type"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "execwatch_metrics_auth_cache_hits",
            "Scrapes answered from the cache of review results, without an API call.",
            registry=self.registry,
        )
        for verdict in AccessVerdict:
            self.requests.labels(verdict.value)
        for kind in ("token", "access"):
            self.reviews.labels(kind)


@dataclass
class MetricsAuth:
    """The guard of a metrics server: `answer(request, serve)` gives `serve()`'s answer
    to an allowed scrape, an error answer to any other, or a `Deferred` of either."""

    api: Any
    registry: CollectorRegistry
    config: AuthConfig = field(default_factory=AuthConfig)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.metrics = AuthMetrics(self.registry)
        self._reviews = Reviews(self.api, self.config.audiences)
        self._cache: TLRUCache[bytes, AccessVerdict] = TLRUCache(
            self.config.max_entries, self._expiry, timer=self.clock
        )
        self._inflight: dict[bytes, Future[AccessVerdict]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.config.max_inflight, "metrics-auth")

    def answer(self, request: Request, serve: Callable[[], bytes]) -> bytes | Deferred:
        outcome = self.check(request.headers.get("authorization", ""))
        if isinstance(outcome, AccessVerdict):
            return self._finish(request, serve, outcome)

        def finish(work: Future[Any] | None) -> bytes:
            verdict = AccessVerdict.TIMEOUT if work is None else work.result()
            return self._finish(request, serve, verdict)

        return Deferred(outcome, self.clock() + self.config.budget, finish)

    def check(self, authorization: str) -> AccessVerdict | Future[AccessVerdict]:
        """The cached verdict for this token on /metrics, else the review under way."""
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return AccessVerdict.UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).digest()
        with self._lock:
            cached = self._cache.get(key)  # a hit not expired: now the newest
            if cached is not None:
                self.metrics.cache_hits.inc()
                return cached
            work = self._inflight.get(key)
            if work is not None:
                return work
            if len(self._inflight) >= self.config.max_inflight:
                return AccessVerdict.BUSY
            work = self._pool.submit(self._review, key, token)
            self._inflight[key] = work
            return work

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _finish(
        self, request: Request, serve: Callable[[], bytes], verdict: AccessVerdict
    ) -> bytes:
        self.metrics.requests.labels(verdict.value).inc()
        if verdict is AccessVerdict.ALLOWED:
            return serve()
        status, extra = _STATUS.get(verdict, _UNAVAILABLE)
        text = f"{verdict.value}\n".encode()
        return response(status, "text/plain", text, request.method, extra)

    def _review(self, key: bytes, token: str) -> AccessVerdict:
        deadline = self.clock() + self.config.budget
        try:
            verdict = self._verdict(token, deadline)
        except Exception as exc:  # an ApiError of any kind (no answer, 5xx, 403...)
            log.warning("metrics auth review failed: %s", one_line(f"{type(exc).__name__}: {exc}"))
            verdict = AccessVerdict.TIMEOUT if errors.timed_out(exc) else AccessVerdict.ERROR
        with self._lock:
            self._inflight.pop(key, None)
            if verdict in _FINAL:
                self._cache[key] = verdict
        return verdict

    def _expiry(self, _key: bytes, verdict: AccessVerdict, now: float) -> float:
        ttl = self.config.allow_ttl if verdict is AccessVerdict.ALLOWED else self.config.deny_ttl
        return now + ttl

    def _verdict(self, token: str, deadline: float) -> AccessVerdict:
        self.metrics.reviews.labels("token").inc()
        who = self._reviews.identity(token)
        if who is None:
            return AccessVerdict.UNAUTHENTICATED
        if self.clock() > deadline:  # the scrape got its 503; do not start another call
            return AccessVerdict.TIMEOUT
        self.metrics.reviews.labels("access").inc()
        return (
            AccessVerdict.ALLOWED
            if self._reviews.allowed(who, METRICS_PATH)
            else AccessVerdict.FORBIDDEN
        )


@dataclass
class CertificateFiles:
    """Keeps `ctx` serving the current `cert` and `key`: a rotated Secret (cert-manager,
    OpenShift's service CA) reaches new handshakes within `every` seconds, open ones keep
    theirs. A pair that does not load (caught mid-rotation) leaves the previous one."""

    ctx: ssl.SSLContext
    cert: str
    key: str
    every: float = 60.0
    _seen: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self._seen = self._stamp()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="metrics-tls", daemon=True).start()

    def refresh(self) -> bool:
        """Load the files again if they changed; True when the new pair is served."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        try:  # a failed load can leave a context half changed: try the pair aside first
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key)
            self.ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("metrics certificate not reloaded: %s", one_line(str(exc)))
            return False
        self._seen = stamp
        return True

    def _stamp(self) -> tuple[float, float] | None:
        try:
            return (Path(self.cert).stat().st_mtime, Path(self.key).stat().st_mtime)
        except OSError:
            return None

    def _loop(self) -> None:
        while True:
            time.sleep(self.every)
            self.refresh()


def tls_context(cert: str | None, key: str | None, names: list[str]) -> ssl.SSLContext:
    """A server context with the certificate files given, or a self-signed one for
    `names` made now (kept in memory only; the scraper then skips verification, as with
    controller-runtime's default)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert and key:
        ctx.load_cert_chain(cert, key)
        return ctx
    import datetime as dt

    from execwatch.serving.certs import issue

    bundle = issue(names, dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory(prefix="execwatch-tls-") as tmp:
        cert_file, key_file = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_file.write_bytes(bundle.cert + bundle.ca_cert)
        key_file.write_bytes(bundle.key)
        ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx
