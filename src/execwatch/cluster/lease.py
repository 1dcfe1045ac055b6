"""Leader election on a coordination.k8s.io Lease, the way client-go does it.

Why not `kubernetes.leaderelection` from the official client: its LeaseLock builds its
own `CoordinationV1Api()` from the process-wide default configuration (so it cannot run
with an explicit ServiceAccount's ApiClient next to another identity), its loop has no
stop and never releases the Lease (a clean shutdown then costs a full lease duration of
no leader), and it reports leadership through a callback thread only. This is the same
algorithm (optimistic concurrency on the Lease's resourceVersion, acquire only after the
holder's record has not changed for a whole lease duration as measured on our own
monotonic clock) in under 200 lines, with `is_leader()` usable as a fence before each write.

Safety margin: a leader stops acting `renew_deadline` after its last successful renew;
another replica can take over only `lease_duration` after it last saw a change. With
renew_deadline < lease_duration two leaders never act at the same time unless clocks
run at very different rates; the handler's writes are idempotent for that case anyway.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from execwatch.cluster import errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    request_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")


def _now() -> datetime:
    """Now, never on a whole second: the client serialises datetimes with isoformat(),
    which drops the fraction when it is zero, and the API server's MicroTime then
    refuses the value."""
    now = datetime.now(tz=UTC)
    return now if now.microsecond else now.replace(microsecond=1)


@dataclass
class LeaseElector:
    """Campaigns for a Lease until stopped; `leading` is set while we hold it."""

    config: LeaseConfig
    api_client: Any
    on_change: Callable[[bool], None] = lambda leading: None
    clock: Callable[[], float] = time.monotonic
    leading: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        from kubernetes import client

        self._client = client
        self._api = client.CoordinationV1Api(self.api_client)
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0

    def is_leader(self) -> bool:
        """True only while our last renew is younger than renew_deadline: the fence."""
        return self.leading.is_set() and (
            self.clock() - self._renewed_at < self.config.renew_deadline
        )

    def sole_time_left(self) -> float:
        """Seconds during which no other replica can have taken the Lease since our last
        renew (it must first see the Lease unchanged for a whole lease duration)."""
        return self._renewed_at + self.config.lease_duration - self.clock()

    def sole_actor(self) -> bool:
        return self.sole_time_left() > 0

    def run(self, stop: threading.Event) -> None:
        """Campaign and renew until `stop`; then release the Lease if we hold it."""
        cfg = self.config
        try:
            while not stop.is_set():
                try:
                    ok = self._try_acquire_or_renew()
                except Exception:  # a bug or an unparseable answer must not end the campaign
                    log.exception("lease round failed")
                    ok = False
                now = self.clock()
                if ok:
                    self._renewed_at = now
                    if not self.leading.is_set():
                        log.info("became leader", extra={"kv": {"identity": cfg.identity}})
                        self.leading.set()
                        self.on_change(True)
                elif self.leading.is_set() and now - self._renewed_at >= cfg.renew_deadline:
                    self._lose("renew deadline passed")
                jitter = 1.0 if self.leading.is_set() else random.uniform(1.0, 1.2)
                stop.wait(cfg.retry_period * jitter)
        finally:
            if self.leading.is_set():
                self._lose("stopping")
                self._release()

    def _lose(self, why: str) -> None:
        log.warning("lost leadership", extra={"kv": {"identity": self.config.identity, "why": why}})
        self.leading.clear()
        self.on_change(False)

    def _try_acquire_or_renew(self) -> bool:
        cfg, c = self.config, self._client
        try:
            with errors.translate():
                lease = self._api.read_namespaced_lease(
                    cfg.name, cfg.namespace, _request_timeout=cfg.request_timeout
                )
        except errors.NotFoundError:
            body = c.V1Lease(
                metadata=c.V1ObjectMeta(name=cfg.name, namespace=cfg.namespace),
                spec=c.V1LeaseSpec(
                    holder_identity=cfg.identity,
                    lease_duration_seconds=max(1, round(cfg.lease_duration)),
                    acquire_time=_now(),
                    renew_time=_now(),
                    lease_transitions=0,
                ),
            )
            return self._write(
                lambda: self._api.create_namespaced_lease(
                    cfg.namespace, body, _request_timeout=cfg.request_timeout
                )
            )
        except errors.ApiError as err:  # refused, no answer, timeout
            log.info("cannot read lease", extra={"kv": errors.as_dict(err)})
            return False

        spec = lease.spec or c.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.lease_duration_seconds or cfg.lease_duration)
        if holder and holder != cfg.identity and now - self._observed_at < duration:
            return False  # someone else holds a live lease
        if holder != cfg.identity:
            spec.acquire_time = _now()
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = cfg.identity
        spec.lease_duration_seconds = max(1, round(cfg.lease_duration))
        spec.renew_time = _now()
        lease.spec = spec
        return self._write(
            lambda: self._api.replace_namespaced_lease(
                cfg.name, cfg.namespace, lease, _request_timeout=cfg.request_timeout
            )
        )

    def _write(self, call: Callable[[], Any]) -> bool:
        """Create/replace the Lease; a 409 means another replica got there first."""
        try:
            with errors.translate():
                written = call()
        except errors.ApiError as err:
            log.info("lease write failed", extra={"kv": errors.as_dict(err)})
            return False
        spec = written.spec
        self._observed = (spec.holder_identity or "", str(spec.renew_time))
        self._observed_at = self.clock()
        return True

    def _release(self) -> None:
        """Hand the Lease back so the other replica takes over at its next retry."""
        cfg = self.config
        try:
            lease = self._api.read_namespaced_lease(
                cfg.name, cfg.namespace, _request_timeout=cfg.request_timeout
            )
            if lease.spec is None or lease.spec.holder_identity != cfg.identity:
                return
            self._renewed_at = float("-inf")  # from now on another replica may lead
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = _now()
            self._api.replace_namespaced_lease(
                cfg.name, cfg.namespace, lease, _request_timeout=cfg.request_timeout
            )
            log.info("released lease", extra={"kv": {"identity": cfg.identity}})
        except Exception as exc:
            log.info("could not release lease", extra={"kv": {"error": type(exc).__name__}})
