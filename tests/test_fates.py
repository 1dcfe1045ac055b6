"""The pipeline's hold on a file with no #! (pipeline.fates), as pure logic: which verdict
each caller's fate gives, and that its tables stay bounded and count what they drop. The
real probe's part is in tests/probe/test_missing_shebang.py."""

from __future__ import annotations

from execwatch.pipeline.fates import (
    FATE_EXIT_FORGOTTEN,
    FATE_HOLD_FULL,
    FATE_LOST,
    Fates,
)
from execwatch.record import Diagnosis, EnoexecExit, ExecFailed, ExecFailure, Reason

FAILED_AT = 1000.0


def failure(tgid: int, at: float = FAILED_AT) -> ExecFailure:
    event = ExecFailed(
        time=at,
        errno=8,
        pid=tgid,
        tgid=tgid,
        ppid=1,
        uid=0,
        comm="runc:[2:INIT]",
        parent_comm="runc",
        path="/app/run.sh",
        cgroup_id=1,
        mntns=1,
        syscall="execve",
    )
    diagnosis = Diagnosis(Reason.NO_SHEBANG, "amd64", detail='starts with "x"')
    return ExecFailure(event, diagnosis)


def exit_of(tgid: int, code: int = 1, *, execed: bool = False) -> EnoexecExit:
    held = failure(tgid).event
    return EnoexecExit(
        time=held.time,
        pid=held.pid,
        tgid=held.tgid,
        ppid=held.ppid,
        uid=held.uid,
        comm=held.comm,
        parent_comm=held.parent_comm,
        cgroup_id=held.cgroup_id,
        mntns=held.mntns,
        syscall="exit_group",
        exit_code=code,
        age_ms=0.1,
        failed_time=FAILED_AT,
        execed=execed,
    )


class Drops(list[str]):
    def __call__(self, kind: str) -> None:
        self.append(kind)


def test_an_exit_that_comes_first_decides_the_failure_held_later() -> None:
    fates: Fates[str] = Fates(2.0, dropped=Drops())
    assert fates.exited(exit_of(7), now=0.0) == []

    [(token, verdict)] = fates.hold("slot", failure(7), now=0.001)

    assert token == "slot"
    assert verdict.diagnosis.reason is Reason.MISSING_SHEBANG
    assert verdict.diagnosis.detail.endswith(
        "runc:[2:INIT] exited with status 1 0.1 ms later without running anything else:"
        " nothing retried it with a shell"
    )


def test_exit_zero_or_after_an_exec_is_benign() -> None:
    fates: Fates[str] = Fates(2.0, dropped=Drops())
    fates.hold("a", failure(1), now=0.0)
    fates.hold("b", failure(2), now=0.0)

    [(_, by_itself)] = fates.exited(exit_of(1, code=0), now=0.1)
    [(_, retried)] = fates.exited(exit_of(2, code=0, execed=True), now=0.1)

    assert by_itself.diagnosis.reason is Reason.NO_SHEBANG
    assert "ran it itself" in by_itself.diagnosis.detail
    assert retried.diagnosis.reason is Reason.NO_SHEBANG
    assert "ran another program next" in retried.diagnosis.detail


def test_the_window_ends_benign_for_a_live_caller_and_counts_a_lost_one() -> None:
    drops = Drops()
    fates: Fates[str] = Fates(2.0, dropped=drops, alive=lambda tgid: tgid == 1)
    fates.hold("alive", failure(1), now=0.0)
    fates.hold("gone", failure(2), now=0.0)
    assert fates.expire(now=2.4) == []  # the window and its slack are not over yet

    verdicts = dict(fates.expire(now=2.6))

    assert {v.diagnosis.reason for v in verdicts.values()} == {Reason.NO_SHEBANG}
    assert "kept running for 2 s" in verdicts["alive"].diagnosis.detail
    assert "the kernel's word on how it ended was lost" in verdicts["gone"].diagnosis.detail
    assert drops == [FATE_LOST]


def test_both_tables_are_bounded_and_count_what_they_drop() -> None:
    drops = Drops()
    fates: Fates[int] = Fates(2.0, dropped=drops, max_held=2, max_exits=2)
    for tgid in (1, 2, 3):
        fates.exited(exit_of(100 + tgid), now=0.0)
    released = [fates.hold(tgid, failure(tgid), now=0.0) for tgid in (1, 2, 3)]

    assert released[:2] == [[], []]
    [(oldest, verdict)] = released[2]
    assert oldest == 1 and verdict.diagnosis.reason is Reason.NO_SHEBANG
    assert "not waited for its caller's fate: too many were waiting" in verdict.diagnosis.detail
    assert drops == [FATE_EXIT_FORGOTTEN, FATE_HOLD_FULL]
