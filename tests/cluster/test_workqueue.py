"""The work queue's order, as pure logic: objects due are handed out round-robin over
their groups, and a group at its share waits until one of its own is finished."""

from __future__ import annotations

from typing import Any

from execwatch.kube.workqueue import WorkQueue, by_namespace, by_namespace_and_name


def pod(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}}


def fair(share: int = 0) -> WorkQueue:
    clock = [0.0]
    return WorkQueue(
        clock=lambda: clock[0], key=by_namespace_and_name, group=by_namespace, share=share
    )


def names(queue: WorkQueue, n: int) -> list[str]:
    got = [queue.get(timeout=0) for _ in range(n)]
    return [by_namespace_and_name(p) if p else "-" for p in got]


def test_due_objects_take_turns_by_namespace_whatever_order_they_came_in() -> None:
    queue = fair()
    for i in range(3):
        queue.add(pod("noisy", f"n{i}"))
    queue.add(pod("quiet", "q0"))
    queue.add(pod("other", "o0"))

    assert names(queue, 6) == ["noisy/n0", "quiet/q0", "other/o0", "noisy/n1", "noisy/n2", "-"]


def test_a_namespace_at_its_share_waits_for_one_of_its_own_to_finish() -> None:
    queue = fair(share=2)
    for i in range(4):
        queue.add(pod("noisy", f"n{i}"))

    first = [queue.get(timeout=0) for _ in range(2)]
    assert queue.get(timeout=0) is None, "two of noisy's are being worked on"
    queue.add(pod("quiet", "q0"))
    assert names(queue, 1) == ["quiet/q0"]
    assert first[0] is not None
    queue.finished(first[0])
    assert names(queue, 2) == ["noisy/n2", "-"]


def test_take_removes_only_the_queued_objects_chosen() -> None:
    queue = fair()
    for name in ("a", "b", "c"):
        queue.add(pod("ns", name))
    taken = queue.get(timeout=0)

    late = queue.take(lambda p: p["metadata"]["name"] in ("a", "b"))

    assert taken is not None and taken["metadata"]["name"] == "a"
    assert [p["metadata"]["name"] for p in late] == ["b"]
    assert names(queue, 2) == ["ns/c", "-"]


def test_without_groups_the_queue_is_first_due_first_out() -> None:
    clock = [0.0]
    queue = WorkQueue(clock=lambda: clock[0])
    queue.add({"metadata": {"name": "later"}}, delay=5)
    queue.add({"metadata": {"name": "now"}})

    assert [p and p["metadata"]["name"] for p in (queue.get(0), queue.get(0))] == ["now", None]
    clock[0] = 5
    got = queue.get(0)
    assert got is not None and got["metadata"]["name"] == "later"
