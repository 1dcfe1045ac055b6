"""The admission webhooks: a scheduling gate on new pods of opted-in namespaces.

The API server calls them only for namespaces labelled `execwatch.io/placement` (the
webhook configurations' namespaceSelector) and only on pod CREATE: the mutating `/gate`
for `enforce` and `mitigate`, the validating `/warn` for `warn`. They answer within
milliseconds from the request alone: no API call, no registry. The controller does the
slow part while the pod waits, gated, for the scheduler.

Nothing in a request is believed beyond the answer to it: `/gate` only answers with a
patch for the caller, and `/warn` hands on only the pod's namespace, name and UID, which
the warn worker reads again from the API server (warnmode.py). A POST that is not the API
server's therefore changes nothing and reads nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

GATE = "execwatch.io/verify"
GATED_LABEL = "execwatch.io/verify"  # lets the controller list and watch only gated pods
GATED_VALUE = "pending"
WARNING = (
    "execwatch.io/placement=warn: this pod is not gated; where its binaries run is"
    " reported in an Event on it (on its owner when it has no name yet)"
)
MODE_LABEL = "execwatch.io/placement"
MAX_REVIEW_BYTES = 3 << 20  # the API server's own request limit for an object is 3 MiB


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer."""


@dataclass(frozen=True)
class Skip:
    why: str


@dataclass(frozen=True)
class PodRef:
    """Which pod a warn-mode review was about; nothing else of the request is kept."""

    namespace: str
    name: str
    uid: str


Warned = Callable[[PodRef], None]  # must not block


def review(body: bytes, own_namespace: str, warn: Warned | None = None) -> bytes:
    """The AdmissionReview answer to `body`: always allowed, with a patch when gated. In
    warn mode (`warn` set) an admission warning, never a patch, and the pod's reference
    handed to `warn` for its Event unless the request is a dry run."""
    if len(body) > MAX_REVIEW_BYTES:
        raise BadReview("admission review over 3 MiB")
    try:
        request = json.loads(body)["request"]
        uid = str(request["uid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BadReview(f"not an AdmissionReview: {exc}") from None
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    pod = request.get("object") if isinstance(request.get("object"), dict) else None
    if pod is not None and warn and skip_reason(request, pod, own_namespace) is None:
        response["warnings"] = [WARNING]
        ref = pod_ref(request, pod)
        if ref is not None and not request.get("dryRun"):  # a dry run: no Event
            warn(ref)
    elif pod is not None and skip_reason(request, pod, own_namespace) is None:
        patch = gate_patch(pod)
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return json.dumps(answer).encode()


def pod_ref(request: Mapping[str, Any], pod: Mapping[str, Any]) -> PodRef | None:
    """The namespace, name and UID of the pod under review: all three are set when the
    validating webhook is called (the API server names the pod and gives it its UID
    before validation), else None."""
    meta = pod.get("metadata") or {}
    namespace = str(request.get("namespace") or "")
    ref = PodRef(namespace, str(meta.get("name") or ""), str(meta.get("uid") or ""))
    return ref if ref.namespace and ref.name and ref.uid else None


def skip_reason(request: Mapping[str, Any], pod: Mapping[str, Any], own: str) -> Skip | None:
    """Why this pod is not gated, or None to gate it."""
    if request.get("operation") != "CREATE" or (request.get("kind") or {}).get("kind") != "Pod":
        return Skip("not a pod create")
    if request.get("subResource"):
        return Skip("a subresource")
    return pod_skip_reason(str(request.get("namespace") or ""), pod, own)


def pod_skip_reason(namespace: str, pod: Mapping[str, Any], own: str) -> Skip | None:
    """Why this pod of `namespace` is never placed, or None."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    if namespace.startswith("kube-") or namespace == own:
        return Skip(f"namespace {namespace} is never gated")
    if spec.get("nodeName"):
        return Skip("nodeName is set: the scheduler is not involved")
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return Skip("a DaemonSet pod belongs on every node")
    if any(g.get("name") == GATE for g in spec.get("schedulingGates") or []):
        return Skip("already gated")
    return None


def gate_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch operations that add the gate and the label, whatever exists already."""
    spec = pod.get("spec") or {}
    labels = (pod.get("metadata") or {}).get("labels")
    ops: list[dict[str, Any]] = []
    if spec.get("schedulingGates"):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]})
    if labels:
        path = "/metadata/labels/" + GATED_LABEL.replace("~", "~0").replace("/", "~1")
        ops.append({"op": "add", "path": path, "value": GATED_VALUE})
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {GATED_LABEL: GATED_VALUE}})
    return ops


def http_handler(
    own_namespace: str, warned: Warned = lambda ref: None
) -> Callable[[str, bytes], tuple[int, bytes]]:
    """The webhook's HTTP routes: POST /gate (enforce and mitigate namespaces) and POST
    /warn (warn namespaces, whose pods' references go to `warned`) answer AdmissionReviews."""

    def handle(url_path: str, body: bytes) -> tuple[int, bytes]:
        route = url_path.split("?", 1)[0]
        if route not in ("/gate", "/warn"):
            return 404, b'{"message": "no such webhook"}'
        try:
            return 200, review(body, own_namespace, warned if route == "/warn" else None)
        except BadReview as exc:
            return 400, json.dumps({"message": str(exc)}).encode()

    return handle
