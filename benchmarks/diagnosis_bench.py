"""How often the entrypoint of a container that dies at once is still diagnosed.

    .venv/bin/python -m benchmarks.diagnosis_bench [--tries 100] [--case missing-library]

Each try creates a pod and a container through containerd's CRI plugin whose entrypoint
is an arm64 binary: it fails exec and the container is gone within milliseconds, with
no task left to read the image through. The node pipeline (probe -> diagnosis ->
attribution) must still say ForeignArchitecture/arm64, from the container's rootfs
found by its id and checked against the root inode the kernel reported. With --case,
the entrypoint is instead a case of tests/probe/deaths.py (an image of its root) that
dies right after a successful exec, and the case's reason is expected.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tests.attribution.containerd_env import APP_IMAGE, Containerd, oci_archive_of
from tests.attribution.runc_env import FOREIGN_ARCH, FOREIGN_IN_ROOTFS
from tests.probe.deaths import BY_NAME, DEATHS, KEEPALIVE, Death, DeathTracer

from benchmarks.common import require_root, save
from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.probe import Probe
from execwatch.record import ExecFailure, Reason


def case_image(containerd: Containerd, death: Death, tmp: Path) -> str:
    image = f"docker.io/execwatch/death-{death.name}:bench"
    root = death.container_root(tmp / death.name)
    containerd.import_image(oci_archive_of(tmp / f"{death.name}.tar", image, root, KEEPALIVE))
    return image


def run_once(
    containerd: Containerd, tracer: DeathTracer, name: str, command: list[str], image: str
) -> ExecFailure | None:
    """One pod whose entrypoint fails; the probe is consumed all along, as the agent does."""
    pod = containerd.run_pod(name, namespace="bench", labels={})
    try:
        containerd.create_container(pod, "app", command, image=image)
        return tracer.wait_for(
            lambda r: r.event.path == command[0] and r.attribution.pod_uid == pod.uid, 10
        )
    except AssertionError:  # nothing came within 10 s
        return None
    finally:
        containerd.remove_pod(pod)


def diagnosed(record: ExecFailure | None, death: Death | None) -> bool:
    if record is None:
        return False
    if death is not None:
        return record.diagnosis.reason is death.reason
    d = record.diagnosis
    return d.reason is Reason.FOREIGN_ARCHITECTURE and d.binary_arch == FOREIGN_ARCH


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=100)
    shown = [d.name for d in DEATHS if d.shown]
    parser.add_argument("--case", choices=shown, help="an early death instead")
    args = parser.parse_args(argv)
    require_root()
    death = BY_NAME[args.case] if args.case else None
    command = list(death.argv) if death else [FOREIGN_IN_ROOTFS]
    reasons: dict[str, int] = {}
    why: dict[str, int] = {}  # the detail of each miss: what the diagnosis could not read
    with tempfile.TemporaryDirectory() as tmp:
        containerd = Containerd(Path(tmp))
        containerd.start()
        try:
            image = case_image(containerd, death, Path(tmp)) if death else APP_IMAGE
            with (
                Attributor(containers=CriContainers(sockets=[containerd.socket])) as attributor,
                Probe() as probe,
            ):
                tracer = DeathTracer(probe, show_crashes=False, attributor=attributor)
                try:
                    for i in range(args.tries):
                        record = run_once(containerd, tracer, f"bench-{i}", command, image)
                        key = (
                            "diagnosed"
                            if diagnosed(record, death)
                            else (str(record.diagnosis.reason) if record else "missing")
                        )
                        reasons[key] = reasons.get(key, 0) + 1
                        if record is not None and key != "diagnosed":
                            why.setdefault(record.diagnosis.detail, 0)
                            why[record.diagnosis.detail] += 1
                        tracer.records.clear()
                finally:
                    tracer.close()
        finally:
            containerd.stop()
    result: dict[str, object] = {
        "case": args.case or "foreign-architecture",
        "tries": args.tries,
        "outcomes": reasons,
        "misses": why,
        "diagnosis_rate": round(reasons.get("diagnosed", 0) / args.tries, 4),
    }
    print(json.dumps(result, indent=2))
    print(f"saved {save('diagnosis', result)}")
    return result


if __name__ == "__main__":
    main()
