"""One OCI walk for every store (scan.oci): the same image tree, given as a layout
directory, an image archive and a registry, meets the same depth limit and the same
check of the config against its digest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from execwatch.runnable.limits import Limits
from tests.support.images.imagebuild import Blobs, Image, add_image, file, tar_directory
from tests.support.registry.registry_server import Blob, HostileRegistry
from tests.support.scan.scan_cli import scan_error, scan_json

INDEX = "application/vnd.oci.image.index.v1+json"
DEPTH = Limits().max_index_depth

# a store of the layout at `root`: the argv that scans it
Store = Callable[[Path, Path], list[str]]


def nested_layout(root: Path, levels: int) -> tuple[Path, str]:
    """An OCI layout whose image lies under `levels` indexes, index.json the first; and
    the digest of the image's config."""
    blobs = Blobs(root)
    desc = add_image(blobs, Image([[file("bin/run", b"#!/bin/sh\n", mode=0o755)]]))
    manifest = json.loads((root / "blobs/sha256" / desc["digest"][7:]).read_bytes())
    for _ in range(levels - 1):
        desc = blobs.put_json({"schemaVersion": 2, "mediaType": INDEX, "manifests": [desc]}, INDEX)
    top = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [desc]}
    (root / "index.json").write_text(json.dumps(top))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root, str(manifest["config"]["digest"])


def as_directory(layout: Path, work: Path) -> list[str]:
    return [str(layout)]


def as_archive(layout: Path, work: Path) -> list[str]:
    work.mkdir()
    return [str(tar_directory(layout, work / "image.tar"))]


def served_by(registry: HostileRegistry) -> Store:
    def store(layout: Path, work: Path) -> list[str]:
        for blob in (layout / "blobs/sha256").iterdir():
            data, digest = blob.read_bytes(), "sha256:" + blob.name
            registry.blobs[digest] = Blob(data)
            media_type = json.loads(data).get("mediaType") if data[:1] == b"{" else None
            if media_type is not None:
                registry.manifests[f"team/app/{digest}"] = (media_type, data)
        top = (layout / "index.json").read_bytes()
        registry.manifests["team/app/1"] = (INDEX, top)
        cache = ["--cache-dir", str(work / "cache")]
        return [f"{registry.host}/team/app:1", "--insecure-registry", registry.host, *cache]

    return store


@pytest.fixture(params=["directory", "archive", "registry"])
def store(request: pytest.FixtureRequest, hostile: HostileRegistry) -> Store:
    kinds: dict[str, Store] = {
        "directory": as_directory,
        "archive": as_archive,
        "registry": served_by(hostile),
    }
    return kinds[request.param]


def test_indexes_are_followed_to_the_depth_limit_and_no_deeper(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deepest, _ = nested_layout(tmp_path / "deepest", DEPTH)
    _, doc = scan_json(capsys, *store(deepest, tmp_path / "a"))
    assert len(doc["images"]) == 1  # scanned: its /bin/run lacks its /bin/sh
    assert [f["path"] for f in doc["findings"]] == ["/bin/run"]
    too_deep, _ = nested_layout(tmp_path / "too-deep", DEPTH + 1)
    message = scan_error(capsys, *store(too_deep, tmp_path / "b"))
    assert f"indexes nested deeper than {DEPTH}" in message


def test_a_config_that_does_not_match_its_digest_is_refused(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout, config_digest = nested_layout(tmp_path / "l", 1)
    blob = layout / "blobs/sha256" / config_digest[7:]
    data = blob.read_bytes()
    assert b", " in data
    blob.write_bytes(
        data.replace(b", ", b",\t", 1)
    )  # the same JSON and size: only its digest differs
    message = scan_error(capsys, *store(layout, tmp_path / "work"))
    assert "does not match" in message and config_digest[:19] in message
