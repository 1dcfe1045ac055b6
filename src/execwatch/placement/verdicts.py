"""ImageVerdict objects: the one cache of what each image digest runs on, per platform.

The placement controller writes what its scans found, the handler writes what it saw
fail on a node (`observed`), and both read. An observed failure outranks a scan that
says "runs" for the same platform: it is what no static scan sees (a binary fetched at
run time, one on a volume). Writes are read-modify-write under the object's
resourceVersion, so concurrent writers merge instead of overwriting each other.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from execwatch.cluster import errors
from execwatch.cluster.rest import Rest, path
from execwatch.placement.decision import Outcome

GROUP, VERSION, PLURAL = "execwatch.io", "v1alpha1", "imageverdicts"
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
MAX_WHY = 8
WRITE_ATTEMPTS = 16


def object_name(digest: str) -> str:
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
    return digest.replace(":", "-")


@dataclass(frozen=True)
class PlatformVerdict:
    platform: str  # OCI platform, os/arch[/variant]
    outcome: Outcome
    source: str  # "scan" or "observed"
    time: str  # RFC 3339
    why: tuple[str, ...] = ()
    count: int = 0

    @property
    def arch(self) -> str:
        """The node label value `kubernetes.io/arch` this platform runs on."""
        return self.platform.split("/")[1]

    def to_api(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "outcome": str(self.outcome),
            "source": self.source,
            "time": self.time,
            "why": list(self.why[:MAX_WHY]),
            "count": self.count,
        }

    @classmethod
    def from_api(cls, obj: Mapping[str, Any]) -> PlatformVerdict:
        return cls(
            str(obj["platform"]),
            Outcome(obj["outcome"]),
            str(obj["source"]),
            str(obj["time"]),
            tuple(str(w) for w in obj.get("why") or ()),
            int(obj.get("count") or 0),
        )


@dataclass(frozen=True)
class ImageVerdict:
    digest: str
    image: str
    platforms: Mapping[str, PlatformVerdict] = field(default_factory=dict)

    def merged(self, news: Iterable[PlatformVerdict]) -> ImageVerdict:
        out = dict(self.platforms)
        for new in news:
            old = out.get(new.platform)
            keeps_observed = (
                old is not None
                and old.source == "observed"
                and old.outcome is Outcome.FAILS
                and new.source == "scan"
            )
            if not keeps_observed:
                out[new.platform] = new
        return replace(self, platforms=out)

    def status(self, last_used: str) -> dict[str, Any]:
        def which(outcome: Outcome) -> str:
            return ",".join(sorted(p for p, v in self.platforms.items() if v.outcome is outcome))

        return {
            "runs": which(Outcome.RUNS),
            "emulated": which(Outcome.EMULATED),
            "fails": which(Outcome.FAILS),
            "lastUsed": last_used,
            "platforms": [self.platforms[p].to_api() for p in sorted(self.platforms)],
        }


def now_rfc3339(clock: Callable[[], float]) -> str:
    return dt.datetime.fromtimestamp(clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class VerdictStore:
    rest: Rest
    clock: Callable[[], float]

    def _path(self, name: str | None = None) -> str:
        return path("apis", GROUP, VERSION, PLURAL, *((name,) if name else ()))

    def get(self, digest: str) -> ImageVerdict | None:
        obj = self._read(object_name(digest))
        return None if obj is None else _parse(obj)

    def record(self, digest: str, image: str, news: Iterable[PlatformVerdict]) -> ImageVerdict:
        """Merge `news` into the digest's verdict and write it; returns what was written."""
        name, news = object_name(digest), list(news)
        for attempt in range(WRITE_ATTEMPTS):
            obj = self._read(name)
            base = ImageVerdict(digest, image) if obj is None else _parse(obj)
            verdict = base.merged(news)
            body: dict[str, Any] = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ImageVerdict",
                "metadata": {"name": name},
                "spec": {"digest": digest, "image": image[:512]},
                "status": verdict.status(now_rfc3339(self.clock)),
            }
            try:
                if obj is None:
                    self.rest.call("POST", self._path(), body=body)
                else:
                    body["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
                    self.rest.call("PUT", self._path(name), body=body)
                return verdict
            except errors.ConflictError:  # another writer came first: merge into theirs
                time.sleep(random.uniform(0, min(0.2, 0.01 * 2**attempt)))
        raise errors.RetryableError(409, "Conflict", f"{name}: {WRITE_ATTEMPTS} writers raced")

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return self.rest.call("GET", self._path(name))
        except errors.NotFoundError:
            return None


def _parse(obj: Mapping[str, Any]) -> ImageVerdict:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    platforms = [PlatformVerdict.from_api(p) for p in status.get("platforms") or []]
    return ImageVerdict(
        str(spec["digest"]), str(spec.get("image") or ""), {p.platform: p for p in platforms}
    )
