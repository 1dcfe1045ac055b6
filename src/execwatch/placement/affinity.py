"""What a pod's spec says about node architectures, and how to narrow it.

Required node affinity is a list of terms that are ORed: a pod may go to a node that
matches any one term. An architecture requirement therefore has to be added to every
term, never appended as a term of its own (that would widen the choice, not narrow it).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ARCH_LABEL = "kubernetes.io/arch"
# A node label no node carries: the pod stays Pending and `kubectl describe` names it.
NO_ARCH_LABEL = "execwatch.io/no-supported-architecture"

Spec = Mapping[str, Any]


@dataclass(frozen=True)
class TermPin:
    """What one required term says about the architecture label."""

    allowed: frozenset[str] | None = None  # In (intersected); None: not restricted by In
    denied: frozenset[str] = frozenset()  # NotIn

    @property
    def restricts(self) -> bool:
        return self.allowed is not None or bool(self.denied)

    def allows(self, arch: str) -> bool:
        return (self.allowed is None or arch in self.allowed) and arch not in self.denied


@dataclass(frozen=True)
class Pin:
    """The architectures the user already chose for the pod: its nodeSelector ANDed with
    its required terms, which are ORed."""

    selector: str | None = None
    terms: tuple[TermPin, ...] = ()

    @property
    def pinned(self) -> bool:
        """True when the user restricted the architecture: the nodeSelector names one, or
        every required term restricts it (a term that does not leaves every one open)."""
        return self.selector is not None or (
            bool(self.terms) and all(t.restricts for t in self.terms)
        )

    def allows(self, arch: str) -> bool:
        if self.selector is not None and arch != self.selector:
            return False
        return not self.terms or any(t.allows(arch) for t in self.terms)


def user_pin(spec: Spec) -> Pin:
    """What the pod's own nodeSelector and required node affinity say about architectures."""
    selector = (spec.get("nodeSelector") or {}).get(ARCH_LABEL)
    terms = tuple(_term_pin(t) for t in _required_terms(spec))
    return Pin(None if selector is None else str(selector), terms)


def narrowed_affinity(spec: Spec, arches: Iterable[str]) -> dict[str, Any]:
    """The pod's affinity with `kubernetes.io/arch In arches` added to every required term
    (one term of its own when there is none). No architecture at all: a term on a label
    that no node has, so the scheduler keeps the pod Pending and says why."""
    affinity: dict[str, Any] = copy.deepcopy(dict(spec.get("affinity") or {}))
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms: list[dict[str, Any]] = required.get("nodeSelectorTerms") or [{}]
    wanted = sorted(set(arches))
    expression: dict[str, Any] = (
        {"key": ARCH_LABEL, "operator": "In", "values": wanted}
        if wanted
        else {"key": NO_ARCH_LABEL, "operator": "Exists"}
    )
    required["nodeSelectorTerms"] = [_with_expression(t, expression) for t in terms]
    return affinity


def _with_expression(term: Mapping[str, Any], expression: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(term)
    out["matchExpressions"] = [*(term.get("matchExpressions") or []), dict(expression)]
    return out


def _required_terms(spec: Spec) -> list[Mapping[str, Any]]:
    node = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def _term_pin(term: Mapping[str, Any]) -> TermPin:
    allowed: frozenset[str] | None = None
    denied: set[str] = set()
    for expr in term.get("matchExpressions") or []:
        if expr.get("key") != ARCH_LABEL:
            continue
        values = frozenset(str(v) for v in expr.get("values") or [])
        operator = expr.get("operator")
        if operator == "In":
            allowed = values if allowed is None else allowed & values
        elif operator == "NotIn":
            denied |= values
        elif operator == "DoesNotExist":
            allowed = frozenset()
    return TermPin(allowed, frozenset(denied))
