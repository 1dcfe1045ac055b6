"""Docker credential helpers (`credsStore`, `credHelpers`) against the real registry.

The helpers are programs the tests write that speak the docker-credential-helpers protocol
(`get`, the server on stdin, JSON on stdout; "credentials not found in native keychain"
and exit 1 when they hold nothing): the protocol's other side, as `pass` or a keychain
would answer it. Debian's golang-docker-credential-helpers needs gnome-keyring or a gpg
`pass` store, so it is not used here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execwatch.scan import credential_helpers
from tests.registry.server import PASSWORD, USER, Registry
from tests.scan.helpers import scan_error, scan_json

HOLDS = """#!/bin/sh
[ "$1" = get ] || exit 3
read -r server
echo "$server" >> "{log}"
if [ "$server" = "{host}" ]; then
  printf '{{"ServerURL": "%s", "Username": "{user}", "Secret": "{secret}"}}\\n' "$server"
else
  echo "credentials not found in native keychain"; exit 1
fi
"""


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:{Path('/usr/bin')}:{Path('/bin')}")
    return d


def helper(bin_dir: Path, name: str, script: str) -> Path:
    path = bin_dir / f"docker-credential-{name}"
    path.write_text(script)
    path.chmod(0o755)
    return path


def docker_config(home: Path, config: dict[str, object]) -> Path:
    path = home / ".docker" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def holds(registry: Registry, log: Path, secret: str = PASSWORD) -> str:
    return HOLDS.format(log=log, host=registry.host, user=USER, secret=secret)


def test_creds_store_answers_for_the_registry(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    bin_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "asked"
    helper(bin_dir, "vault", holds(registry, log))
    # what `docker login` leaves with a credsStore: an empty placeholder under auths
    docker_config(clean_home, {"credsStore": "vault", "auths": {registry.host: {}}})
    code, doc = scan_json(capsys, pushed["ready"], "--registry-ca", str(registry.ca))
    assert (code, doc["findings"]) == (0, [])
    assert log.read_text().split() == [registry.host]


def test_cred_helpers_for_the_host_win_over_the_store(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    bin_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "asked"
    helper(bin_dir, "ecr", holds(registry, log))
    per_host = {"other.example": "absent", registry.host: "ecr"}
    docker_config(clean_home, {"credsStore": "absent", "credHelpers": per_host})
    code, _ = scan_json(capsys, pushed["ready"], "--registry-ca", str(registry.ca))
    assert code == 0 and log.read_text().split() == [registry.host]


def test_a_helper_without_the_host_means_anonymous_and_a_wrong_secret_is_named(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    bin_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ca = ["--registry-ca", str(registry.ca)]
    script = holds(registry, tmp_path / "asked").replace(registry.host, "elsewhere.example")
    helper(bin_dir, "empty", script)
    docker_config(clean_home, {"credsStore": "empty"})
    assert "authentication failed anonymously" in scan_error(capsys, pushed["ready"], *ca)
    helper(bin_dir, "stale", holds(registry, tmp_path / "asked", secret="expired"))
    config = docker_config(clean_home, {"credsStore": "stale"})
    message = scan_error(capsys, pushed["ready"], *ca)
    assert f"authentication failed as ci (from {config}, docker-credential-stale)" in message


FAILING = {
    "broken": ("#!/bin/sh\necho 'keychain locked' >&2\nexit 1\n", "failed: keychain locked"),
    "silent": ("#!/bin/sh\nexit 4\n", "failed: exit status 4"),
    "chatty": ("#!/bin/sh\nhead -c 1000000 /dev/zero\n", "wrote more than 65536 bytes"),
    "garbled": ("#!/bin/sh\necho '{\"User\": 1}'\n", "did not answer with JSON Username"),
    "token": (
        '#!/bin/sh\necho \'{"Username": "<token>", "Secret": "refresh"}\'\n',
        "holds an identity token",
    ),
    "slow": ("#!/bin/sh\nsleep 60\n", "did not answer within 1 s"),
}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_a_failing_helper_is_one_line_exit_2(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    bin_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    monkeypatch.setattr(credential_helpers, "HELPER_SECONDS", 1.0)
    script, said = FAILING[name]
    helper(bin_dir, name, script)
    config = docker_config(clean_home, {"credHelpers": {registry.host: name}})
    message = scan_error(capsys, pushed["ready"], "--registry-ca", str(registry.ca))
    assert f"docker-credential-{name} (named in {config})" in message
    assert said in message


def test_a_missing_helper_or_a_path_for_a_name_is_one_line(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    bin_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ca = ["--registry-ca", str(registry.ca)]
    docker_config(clean_home, {"credsStore": "osxkeychain"})
    message = scan_error(capsys, pushed["ready"], *ca)
    assert "docker-credential-osxkeychain" in message and "is not on PATH" in message
    docker_config(clean_home, {"credsStore": "../../bin/sh"})
    assert "not a credential helper name: '../../bin/sh'" in scan_error(
        capsys, pushed["ready"], *ca
    )
