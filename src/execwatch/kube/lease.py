"""Leader election on a coordination.k8s.io Lease, the way client-go does it.

Why not `kubernetes.leaderelection` from the official client: its LeaseLock builds its
own `CoordinationV1Api()` from the process-wide default configuration (so it cannot run
with an explicit ServiceAccount's credentials next to another identity), its loop has no
stop and never releases the Lease (a clean shutdown then costs a full lease duration of
no leader), and it reports leadership through a callback thread only. This is the same
algorithm (optimistic concurrency on the Lease's resourceVersion, acquire only after the
holder's record has not changed for a whole lease duration as measured on our own
monotonic clock) in under 200 lines, with `is_leader()` usable as a fence before each
write. Its requests go through the handler's `rest.Rest` (plain JSON, one attempt each:
a round that fails is retried by the loop, never inside a request).

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

from execwatch.kube import errors
from execwatch.kube.client import Rest, path

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


def _now() -> str:
    """Now as a MicroTime (microseconds always written: the API server refuses a
    MicroTime without them)."""
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _path(namespace: str, name: str = "") -> str:
    segments = ("apis", "coordination.k8s.io", "v1", "namespaces", namespace, "leases")
    return path(*segments, name) if name else path(*segments)


@dataclass
class LeaseElector:
    """Campaigns for a Lease until stopped; `leading` is set while we hold it."""

    config: LeaseConfig
    rest: Rest
    on_change: Callable[[bool], None] = lambda leading: None
    clock: Callable[[], float] = time.monotonic
    leading: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
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

    def _read(self) -> dict[str, Any]:
        cfg = self.config
        return self.rest.call("GET", _path(cfg.namespace, cfg.name), timeout=cfg.request_timeout)

    def _replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        return self.rest.call(
            "PUT", _path(cfg.namespace, cfg.name), body=lease, timeout=cfg.request_timeout
        )

    def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        try:
            lease = self._read()
        except errors.NotFoundError:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": cfg.identity,
                    "leaseDurationSeconds": max(1, round(cfg.lease_duration)),
                    "acquireTime": _now(),
                    "renewTime": _now(),
                    "leaseTransitions": 0,
                },
            }
            return self._write(
                lambda: self.rest.call(
                    "POST", _path(cfg.namespace), body=body, timeout=cfg.request_timeout
                )
            )
        except errors.ApiError as err:  # refused, no answer, timeout
            log.info("cannot read lease", extra={"kv": errors.as_dict(err)})
            return False

        spec: dict[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime")))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and now - self._observed_at < duration:
            return False  # someone else holds a live lease
        if holder != cfg.identity:
            spec["acquireTime"] = _now()
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = cfg.identity
        spec["leaseDurationSeconds"] = max(1, round(cfg.lease_duration))
        spec["renewTime"] = _now()
        lease["spec"] = spec
        return self._write(lambda: self._replace(lease))

    def _write(self, call: Callable[[], dict[str, Any]]) -> bool:
        """Create/replace the Lease; a 409 means another replica got there first."""
        try:
            written = call()
        except errors.ApiError as err:
            log.info("lease write failed", extra={"kv": errors.as_dict(err)})
            return False
        spec = written.get("spec") or {}
        self._observed = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime")))
        self._observed_at = self.clock()
        return True

    def _release(self) -> None:
        """Hand the Lease back so the other replica takes over at its next retry."""
        cfg = self.config
        try:
            lease = self._read()
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != cfg.identity:
                return
            self._renewed_at = float("-inf")  # from now on another replica may lead
            spec["holderIdentity"] = None
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = _now()
            self._replace(lease)
            log.info("released lease", extra={"kv": {"identity": cfg.identity}})
        except Exception as exc:
            log.info("could not release lease", extra={"kv": {"error": type(exc).__name__}})
