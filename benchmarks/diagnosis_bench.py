"""How often the entrypoint of a container that dies at once is still diagnosed.

    .venv/bin/python -m benchmarks.diagnosis_bench [--tries 100]

Each try creates a pod and a container through containerd's CRI plugin whose entrypoint
is an arm64 binary: it fails exec and the container is gone within milliseconds, with
no task left to read the image through. The node pipeline (probe -> diagnosis ->
attribution) must still say ForeignArchitecture/arm64, from the container's rootfs
found by its id and checked against the root inode the kernel reported.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.attribution.containerd_env import Containerd
from tests.attribution.runc_env import FOREIGN_ARCH, FOREIGN_IN_ROOTFS

from benchmarks.common import require_root, save
from execwatch.attribution import Attributor
from execwatch.attribution.cri.client import CriContainers
from execwatch.diagnosis import FileDiagnoser
from execwatch.pipeline import NodePipeline
from execwatch.probe import Probe
from execwatch.probe.events import boot_to_epoch_offset
from execwatch.record import ExecFailure, Reason


def wait_record(probe: Probe, records: list[ExecFailure], pod_uid: str) -> ExecFailure | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe.poll(20)
        for record in records:
            if record.event.path == FOREIGN_IN_ROOTFS and record.attribution.pod_uid == pod_uid:
                return record
    return None


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=100)
    args = parser.parse_args(argv)
    require_root()
    reasons: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        containerd = Containerd(Path(tmp))
        containerd.start()
        try:
            records: list[ExecFailure] = []
            with (
                Attributor(containers=CriContainers(sockets=[containerd.socket])) as attributor,
                Probe() as probe,
                NodePipeline(
                    FileDiagnoser.for_host(attributor),
                    records.append,
                    epoch_offset=boot_to_epoch_offset(),
                    attributor=attributor,
                ) as pipeline,
            ):
                probe.open_ring_buffer(pipeline.on_record)
                for i in range(args.tries):
                    pod = containerd.run_pod(f"bench-{i}", namespace="bench", labels={})
                    try:
                        containerd.create_container(pod, "app", [FOREIGN_IN_ROOTFS])
                        record = wait_record(probe, records, pod.uid)
                    finally:
                        containerd.remove_pod(pod)
                    ok = (
                        record is not None
                        and record.diagnosis.reason is Reason.FOREIGN_ARCHITECTURE
                        and record.diagnosis.binary_arch == FOREIGN_ARCH
                    )
                    key = (
                        "diagnosed"
                        if ok
                        else (str(record.diagnosis.reason) if record else "missing")
                    )
                    reasons[key] = reasons.get(key, 0) + 1
                    records.clear()
        finally:
            containerd.stop()
    result: dict[str, object] = {
        "tries": args.tries,
        "outcomes": reasons,
        "diagnosis_rate": round(reasons.get("diagnosed", 0) / args.tries, 4),
    }
    print(json.dumps(result, indent=2))
    print(f"saved {save('diagnosis', result)}")
    return result


if __name__ == "__main__":
    main()
