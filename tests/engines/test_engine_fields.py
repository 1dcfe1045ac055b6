"""Pure logic: what the Engine API's answers become, and how a named container prints."""

from __future__ import annotations

import json
import time
from pathlib import Path

from execwatch.attribution.cgroup_layout import CgroupKind, parse_cgroup_path
from execwatch.attribution.engine_api import (
    EngineContainer,
    _event,
    container_from_inspect,
    socket_from_host,
)
from execwatch.attribution.engines import EngineSocket, EngineWatcher, _merge
from execwatch.attribution.podman_storage import PodmanStorage
from execwatch.node.output import human_line
from execwatch.record import Attribution, AttributionStatus, Diagnosis, ExecFailed, ExecFailure
from execwatch.runnable.reason import Reason

CID = "c0ffee" * 10 + "abcd"


def test_inspect_gives_name_image_as_typed_labels_and_layers() -> None:
    found = container_from_inspect(
        {
            "Id": CID,
            "Name": "/web-1",
            "Image": "sha256:" + "1" * 64,
            "Config": {"Image": "shop/web:2", "Labels": {"com.docker.compose.project": "shop"}},
            "GraphDriver": {
                "Name": "overlay2",
                "Data": {"LowerDir": "/d/a-init/diff:/d/b/diff", "UpperDir": "/d/a/diff"},
            },
        }
    )
    assert (found.name, found.image, found.image_id) == (
        "web-1",
        "shop/web:2",
        "sha256:" + "1" * 64,
    )
    assert (found.compose_project, found.compose_service) == ("shop", None)
    assert found.layers is not None
    assert found.layers.top_first == ("/d/a/diff", "/d/a-init/diff", "/d/b/diff")


def test_a_create_event_names_the_container_before_any_inspect() -> None:
    line = json.dumps(
        {
            "Type": "container",
            "Action": "create",
            "Actor": {
                "ID": CID,
                "Attributes": {"name": "web-1", "image": "shop/web:2", "tier": "front"},
            },
            "timeNano": 5,
        }
    ).encode()
    event = _event(line)
    assert event is not None
    assert (event.container_id, event.name, event.image) == (CID, "web-1", "shop/web:2")
    assert event.labels == {"tier": "front"}
    assert _event(b"{not json") is None
    assert _event(json.dumps({"Type": "image", "Action": "pull"}).encode()) is None


def test_an_inspect_adds_to_what_the_event_said_and_never_erases_it() -> None:
    from_event = EngineContainer(CID, "web-1", "shop/web:2", labels={"a": "b"})
    from_image = EngineContainer(CID, image_id="sha256:1")
    merged = _merge(from_event, from_image)
    assert (merged.name, merged.image, merged.image_id, merged.labels) == (
        "web-1",
        "shop/web:2",
        "sha256:1",
        {"a": "b"},
    )


def test_docker_host_names_a_unix_socket_only() -> None:
    assert socket_from_host("unix:///run/user/1000/docker.sock") == "/run/user/1000/docker.sock"
    assert socket_from_host("tcp://10.0.0.1:2375") is None
    assert socket_from_host(None) is None


def test_a_rootless_podman_cgroup_names_its_user() -> None:
    path = f"/user.slice/user-1001.slice/user@1001.service/user.slice/libpod-{CID}.scope"
    layout = parse_cgroup_path(path)
    assert (layout.kind, layout.runtime, layout.owner_uid) == (CgroupKind.CONTAINER, "podman", 1001)
    assert parse_cgroup_path(f"/machine.slice/libpod-{CID}.scope").owner_uid is None


def _human(attribution: Attribution) -> str:
    """The human line of an arm64 entrypoint's failure in the attributed container."""
    event = ExecFailed(
        time=0.0, errno=8, pid=7, tgid=7, ppid=1, uid=0, comm="runc:[2:INIT]",
        parent_comm="runc", path="/bin/server", cgroup_id=1, mntns=1, syscall="execve",
    )  # fmt: skip
    diagnosis = Diagnosis(Reason.FOREIGN_ARCHITECTURE, "amd64", binary_arch="arm64")
    return human_line(ExecFailure(event, diagnosis, attribution))


def test_the_human_line_names_container_image_and_compose_service() -> None:
    line = _human(
        Attribution(
            AttributionStatus.HOST,
            runtime="docker",
            container_id=CID,
            container="shop-web-1",
            image="shop/web:2",
            compose_project="shop",
            compose_service="web",
        )
    )
    assert f"container=shop-web-1 ({CID[:12]} docker) image=shop/web:2 compose=shop/web" in line
    assert f"container={CID[:12]}" in _human(Attribution(container_id=CID))


def test_the_human_line_names_a_podman_containers_pod() -> None:
    named = Attribution(
        AttributionStatus.HOST, runtime="podman", container_id=CID, container="web-1",
        image="shop/web:2", engine_pod="shop",
    )  # fmt: skip
    line = _human(named)
    assert f"container=web-1 ({CID[:12]} podman) image=shop/web:2 engine_pod=shop" in line


def test_a_podman_event_gives_the_containers_pod_id() -> None:
    attributes = {"name": "web-1", "image": "shop/web:2", "podId": "p" * 64}
    line = {"Type": "container", "Action": "create", "Actor": {"ID": CID, "Attributes": attributes}}
    event = _event(json.dumps(line).encode())
    assert event is not None
    assert (event.pod_id, event.labels) == ("p" * 64, {})
    attributes["podId"] = ""  # a container outside any pod
    alone = _event(json.dumps(line).encode())
    assert alone is not None and alone.pod_id is None


def test_a_later_event_does_not_undo_an_inspect() -> None:
    inspected = EngineContainer(CID, "web-1", image_id="sha256:1", inspected=True)
    merged = _merge(inspected, EngineContainer(CID, "web-1", "shop/web:2"))
    assert merged.inspected
    assert (merged.image, merged.image_id) == ("shop/web:2", "sha256:1")


def test_podman_state_gives_name_image_and_the_layer_chain(tmp_path: Path) -> None:
    state = tmp_path / "overlay-containers"
    state.mkdir()
    metadata = json.dumps({"image-name": "docker.io/shop/web:2", "name": "web-1"})
    container = {"id": CID, "names": ["web-1"], "image": "1" * 64, "layer": "top"}
    (state / "containers.json").write_text(json.dumps([{**container, "metadata": metadata}]))
    (tmp_path / "overlay-layers").mkdir()
    layers = [{"id": "base"}, {"id": "top", "parent": "base"}, {"id": "../x", "parent": "top"}]
    (tmp_path / "overlay-layers" / "layers.json").write_text(json.dumps(layers))
    found = PodmanStorage(tmp_path).container(CID)
    assert found is not None
    assert (found.name, found.image, found.image_id) == ("web-1", "docker.io/shop/web:2", "1" * 64)
    assert found.layers is not None
    assert found.layers.top_first == (
        f"{tmp_path}/overlay/top/diff",
        f"{tmp_path}/overlay/base/diff",
    )
    assert PodmanStorage(tmp_path).container("f" * 64) is None
    (state / "containers.json").write_text("[" * 100000)  # nested past the parser's depth
    assert PodmanStorage(tmp_path).container(CID) is None


def test_an_id_waited_for_in_vain_is_not_waited_for_again_at_once() -> None:
    """A cgroup laid out like this engine's that it never reports (another daemon's): one
    wait, then none for UNKNOWN_TTL, so repeated failures there cost no budget."""
    watcher = EngineWatcher(EngineSocket("docker", "/nonexistent.sock"))
    watcher.up = True  # as if its events stream were open
    began = time.monotonic()
    assert watcher.get(CID, wait=0.2) is None
    assert time.monotonic() - began >= 0.2
    began = time.monotonic()
    assert watcher.get(CID, wait=0.2) is None
    assert time.monotonic() - began < 0.05
