"""Reference parsing and credential lookup: pure logic, no registry needed."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from execwatch.runnable.limits import Limits
from execwatch.scan.errors import ScanInputError
from execwatch.scan.registry import Reference, find_credentials, looks_like_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("registry.example:5000/team/app:1.4.2",
         ("registry.example:5000", "team/app", "1.4.2", None)),
        (f"registry.example/team/app@{DIGEST}", ("registry.example", "team/app", None, DIGEST)),
        (f"localhost/app:v1@{DIGEST}", ("localhost", "app", "v1", DIGEST)),
        ("docker://alpine", ("docker.io", "library/alpine", "latest", None)),
        ("docker://bitnami/kubernetes-event-exporter:1.7.0",
         ("docker.io", "bitnami/kubernetes-event-exporter", "1.7.0", None)),
        ("[::1]:5000/app", ("[::1]:5000", "app", "latest", None)),
    ],
)  # fmt: skip
def test_parse(text: str, parsed: tuple[str, str, str | None, str | None]) -> None:
    ref = Reference.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == parsed


def test_only_references_that_name_their_registry_are_taken_for_one() -> None:
    assert looks_like_reference("registry.example/app:1")
    assert looks_like_reference("localhost:5000/app")
    assert not looks_like_reference("app:1")  # a missing local file, not Docker Hub
    assert not looks_like_reference("./build/rootfs")


def auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_most_specific_entry_of_the_first_file_that_has_one(tmp_path: Path) -> None:
    first, second = tmp_path / "auth.json", tmp_path / "config.json"
    first.write_text(json.dumps({"auths": {"other.example": auth("x", "y")}}))
    second.write_text(json.dumps({"auths": {
        "https://reg.example/v1/": auth("host", "p1"),
        "reg.example/team": auth("team", "p2"),
        "reg.example/team/app": {"username": "app", "password": "p3"},
        "reg.example/teamx": auth("wrong", "p4"),
    }}))  # fmt: skip
    files = [str(first), str(second), str(tmp_path / "absent.json")]
    found = find_credentials(Reference.parse("reg.example/team/app:1"), files, Limits())
    assert found is not None and (found.username, found.password) == ("app", "p3")
    found = find_credentials(Reference.parse("reg.example/team/db:1"), files, Limits())
    assert found is not None and found.username == "team"
    found = find_credentials(Reference.parse("reg.example/teamxy/db:1"), files, Limits())
    assert found is not None and found.username == "host"
    assert find_credentials(Reference.parse("none.example/a:1"), files, Limits()) is None


def test_a_broken_credentials_file_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "auth.json"
    bad.write_text(json.dumps({"auths": {"reg.example": {"auth": "bm90LWEtcGFpcg=="}}}))
    with pytest.raises(ScanInputError, match="not base64 of user:password"):
        find_credentials(Reference.parse("reg.example/a:1"), [str(bad)], Limits())
    bad.write_text("[1, 2")
    with pytest.raises(ScanInputError, match="not a credentials file"):
        find_credentials(Reference.parse("reg.example/a:1"), [str(bad)], Limits())
