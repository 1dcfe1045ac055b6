"""Which CPU architectures a pod template may be scheduled to, from `kubernetes.io/arch`.

The same rules as the scheduler's NodeAffinity plugin, for this one label: nodeSelector
must match, and at least one required nodeSelectorTerm must match (expressions ANDed,
terms ORed). Terms that say nothing about the architecture allow every architecture.
"""

from __future__ import annotations

from typing import Any

ARCH_LABELS = ("kubernetes.io/arch", "beta.kubernetes.io/arch")


def allowed_architectures(pod_spec: dict[str, Any], candidates: set[str]) -> set[str]:
    allowed = set(candidates)
    selector = pod_spec.get("nodeSelector") or {}
    for label in ARCH_LABELS:
        if isinstance(selector.get(label), str):
            allowed &= {selector[label]}
    terms = _required_terms(pod_spec)
    if terms is None:
        return allowed
    by_terms: set[str] = set()
    for term in terms:
        by_terms |= _term(term, allowed)
    return by_terms


def _required_terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms")
    return [t for t in terms if isinstance(t, dict)] if isinstance(terms, list) else None


def _term(term: dict[str, Any], candidates: set[str]) -> set[str]:
    out = set(candidates)
    for expr in term.get("matchExpressions") or []:
        if not isinstance(expr, dict) or expr.get("key") not in ARCH_LABELS:
            continue
        values = {v for v in expr.get("values") or [] if isinstance(v, str)}
        op = expr.get("operator")
        if op == "In":
            out &= values
        elif op == "NotIn":
            out -= values
        elif op == "DoesNotExist":
            out = set()  # every node carries the label
    return out
