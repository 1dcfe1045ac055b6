"""The placement controller's decision for one gated pod, written back to the API server.

For each pod the webhook gated in a namespace that opted in (modes.py; a pod that gated
itself anywhere else is left as it is, never judged): judge what every container and
init container starts on each node architecture of the cluster, narrow the pod's
required node affinity to where all of them run, lift the gate, and say why in an Event.
Any failure to judge (registry unreachable, credentials refused, the deadline) lifts the
gate with the pod unchanged: placement never keeps a pod from running that it would have
run without execwatch.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from execwatch import crd
from execwatch.kube import errors
from execwatch.kube.client import Rest, path
from execwatch.kube.safe import fit_bytes, printable
from execwatch.placement.decision import Action, ContainerVerdict, decide
from execwatch.placement.modes import NamespaceModes
from execwatch.placement.webhook import GATE, GATED_LABEL

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
REPORTING_CONTROLLER = "execwatch.io/placement"
NOTE_LIMIT = 1024


class VerdictUnavailable(Exception):
    """What a pod's images run on could not be told in time: one line, the cause."""


class VerdictSource(Protocol):
    def judge(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], deadline: float
    ) -> ContainerVerdict: ...


class Observer(Protocol):
    def decided(self, action: str, seconds: float) -> None: ...
    def failed_open(self, cause: str) -> None: ...


@dataclass(frozen=True)
class Handled:
    """What the controller did to one pod."""

    action: str  # an Action, or "fail-open"
    message: str


EVENT_REASONS = {
    Action.PLACE: "Placed",
    Action.LEAVE: "PlacementUnchanged",
    Action.NOWHERE: "NoArchitectureRuns",
}


@dataclass
class Placer:
    rest: Rest
    source: VerdictSource
    arches: Callable[[], Iterable[str]]
    observer: Observer
    budget: float = 30.0  # seconds from the pod's creation to a decision, else fail open
    clock: Callable[[], float] = time.time
    own_namespace: str = crd.DEFAULT_NAMESPACE
    modes: NamespaceModes | None = None  # made from `rest` when None

    def __post_init__(self) -> None:
        if self.modes is None:
            self.modes = NamespaceModes(self.rest, self.own_namespace)

    def handle(self, pod: Mapping[str, Any]) -> Handled | None:
        """Decide for a gated pod and lift its gate; None when it is not gated (any more)
        or not in a namespace placement serves, which is left as it is."""
        spec = pod.get("spec") or {}
        if _gate_index(spec) is None or not self.serves(pod):
            return None
        deadline = self.deadline(pod)
        try:
            verdicts = self._judge(pod, spec, deadline)
        except VerdictUnavailable as exc:
            return self.fail_open(pod, str(exc))
        decision = decide(spec, verdicts, self.arches())
        self._write(pod, decision.affinity(spec))
        self._event(pod, EVENT_REASONS[decision.action], decision.message, decision.warning)
        self.observer.decided(str(decision.action), max(0.0, self.clock() - _created(pod)))
        return Handled(str(decision.action), decision.message)

    def serves(self, pod: Mapping[str, Any]) -> bool:
        """Whether the pod's namespace opted in (enforce, mitigate); a namespace that cannot
        be read raises the API's error, and the pod is tried again."""
        assert self.modes is not None
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        if self.modes.placed(namespace):
            return True
        log.info("gated pod left alone: its namespace did not opt in to placement",
                 extra={"kv": {"namespace": namespace}})  # fmt: skip
        return False

    def deadline(self, pod: Mapping[str, Any]) -> float:
        """When the pod's budget ends (the clock's seconds): a decision or fail open."""
        return _created(pod) + self.budget

    def warn(self, namespace: str, pod: Mapping[str, Any]) -> Handled | None:
        """Warn mode: the Event an enforced pod would get, on the pod as admitted (on its
        controller when it has no name yet); nothing is written to the pod."""
        meta = {**(pod.get("metadata") or {}), "namespace": namespace}
        pod = {**pod, "metadata": meta}
        subject = _subject(meta)
        if subject is None:
            return None
        started = self.clock()
        try:
            verdicts = self._judge(pod, pod.get("spec") or {}, self.clock() + self.budget)
        except VerdictUnavailable as exc:
            message = f"warn mode, not checked: {exc}"
            self._post(subject, "PlacementSkipped", message, warning=True)
            return Handled("warn", message)
        decision = decide(pod.get("spec") or {}, verdicts, self.arches())
        message = f"warn mode, pod unchanged: {decision.message}"
        restricts = decision.action is not Action.LEAVE or decision.warning
        self._post(subject, EVENT_REASONS[decision.action], message, restricts)
        self.observer.decided("warn", max(0.0, self.clock() - started))
        return Handled("warn", message)

    def _judge(
        self, pod: Mapping[str, Any], spec: Mapping[str, Any], deadline: float
    ) -> list[ContainerVerdict]:
        containers: Sequence[Mapping[str, Any]] = [
            *(spec.get("initContainers") or []),
            *(spec.get("containers") or []),
        ]
        verdicts = []
        for container in containers:
            if self.clock() >= deadline:
                raise VerdictUnavailable(
                    f"no verdict within {self.budget:g} s of the pod's creation"
                )
            verdicts.append(self.source.judge(pod, container, deadline))
        return verdicts

    def refresh(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The pod as the API server has it now, if it is the same pod and still gated."""
        meta = pod["metadata"]
        try:
            now = self.rest.call("GET", _pod_path(meta))
        except errors.NotFoundError:
            return None
        same = (now.get("metadata") or {}).get("uid") == meta.get("uid")
        return now if same and _gate_index(now.get("spec") or {}) is not None else None

    def fail_open(self, pod: Mapping[str, Any], cause: str) -> Handled:
        """Lift the gate, the pod unchanged, and say why."""
        message = f"placed without a verdict: {cause}"
        self._write(pod, None)
        self._event(pod, "PlacementSkipped", message, warning=True)
        self.observer.failed_open(cause.split(":", 1)[0][:64])
        return Handled("fail-open", message)

    def _write(self, pod: Mapping[str, Any], affinity: dict[str, Any] | None) -> None:
        self.rest.call(
            "PATCH",
            _pod_path(pod["metadata"]),
            body=ungate_patch(pod, affinity),
            content_type=JSON_PATCH,
        )

    def _event(self, pod: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        meta = pod["metadata"]
        subject = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
        self._post(subject, reason, message, warning)

    def _post(self, subject: Mapping[str, str], reason: str, message: str, warning: bool) -> None:
        post_event(self.rest, subject, Note(reason, message, warning, "Place"), self.clock)


@dataclass(frozen=True)
class Note:
    """What an Event of placement says: its reason, message, type and action."""

    reason: str
    message: str
    warning: bool
    action: str


def post_event(
    rest: Rest, subject: Mapping[str, str], note: Note, clock: Callable[[], float]
) -> None:
    """An events.k8s.io Event from placement about `subject` (a pod, or its controller);
    an Event that cannot be written is logged, and what it reports stands without it."""
    now = datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{subject['name'][:200]}.placement-{uuid.uuid4().hex[:10]}"},
        "eventTime": now,
        "type": "Warning" if note.warning else "Normal",
        "reason": note.reason,
        "action": note.action,
        "note": fit_bytes(printable(note.message, 4 * NOTE_LIMIT), NOTE_LIMIT),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": REPORTING_CONTROLLER,
        "regarding": dict(subject),
    }
    namespace = subject["namespace"]
    events = path("apis", "events.k8s.io", "v1", "namespaces", namespace, "events")
    try:
        rest.call("POST", events, body=body)
    except errors.ApiError as err:
        log.warning("placement event not written", extra={"kv": errors.as_dict(err)})


def ungate_patch(pod: Mapping[str, Any], affinity: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A JSON patch that applies only to this very pod while it still carries our gate at
    the index seen: the new affinity (when any), the gate and the gated label removed."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    index = _gate_index(spec)
    assert index is not None
    gate = f"/spec/schedulingGates/{index}"
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
        {"op": "test", "path": f"{gate}/name", "value": GATE},
        {"op": "remove", "path": gate},
    ]
    if affinity is not None:
        ops.append({"op": "add", "path": "/spec/affinity", "value": affinity})
    if GATED_LABEL in (meta.get("labels") or {}):
        ops.append({"op": "remove", "path": "/metadata/labels/" + _escape(GATED_LABEL)})
    return ops


def _subject(meta: Mapping[str, Any]) -> dict[str, str] | None:
    """What a warn-mode Event is about: the pod when it has a name, else its controller."""
    namespace = str(meta["namespace"])
    if meta.get("name"):
        return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": meta["name"]}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("name"):
            keys = ("apiVersion", "kind", "name", "uid")
            return {"namespace": namespace, **{k: str(ref.get(k) or "") for k in keys}}
    return None


def _pod_path(meta: Mapping[str, Any]) -> str:
    return path("api", "v1", "namespaces", meta["namespace"], "pods", meta["name"])


def _gate_index(spec: Mapping[str, Any]) -> int | None:
    for i, gate in enumerate(spec.get("schedulingGates") or []):
        if gate.get("name") == GATE:
            return i
    return None


def _created(pod: Mapping[str, Any]) -> float:
    stamp = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return time.time()


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")
