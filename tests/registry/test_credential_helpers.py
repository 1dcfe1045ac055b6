"""Docker credential helpers (`credsStore`, `credHelpers`) against the real registry.

The helpers are programs the tests write that speak the docker-credential-helpers protocol
(`get`, the server on stdin, JSON on stdout; "credentials not found in native keychain"
and exit 1 when they hold nothing): the protocol's other side, as `pass` or a keychain
would answer it. Debian's golang-docker-credential-helpers needs gnome-keyring or a gpg
`pass` store, so it is not used here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from execwatch.scan import credential_helpers
from tests.support.registry.registry_server import PASSWORD, USER, Registry
from tests.support.scan.scan_cli import scan_error, scan_json

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


@dataclass
class Home:
    """A user's home with helpers on PATH and a Docker config.json, and the real registry."""

    registry: Registry
    ready: str  # an arm64 image that needs credentials to pull
    home: Path
    bin: Path
    tmp: Path

    def helper(self, name: str, script: str) -> None:
        path = self.bin / f"docker-credential-{name}"
        path.write_text(script)
        path.chmod(0o755)

    def holds(self, log: str = "asked", secret: str = PASSWORD) -> str:
        """A helper holding the registry's credentials; it logs each server asked for."""
        host = self.registry.host
        return HOLDS.format(log=self.tmp / log, host=host, user=USER, secret=secret)

    def config(self, config: dict[str, object]) -> Path:
        path = self.home / ".docker" / "config.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(config))
        return path

    def asked(self) -> list[str]:
        return (self.tmp / "asked").read_text().split()

    def scan(self, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
        return scan_json(capsys, self.ready, "--registry-ca", str(self.registry.ca))

    def error(self, capsys: pytest.CaptureFixture[str]) -> str:
        return scan_error(capsys, self.ready, "--registry-ca", str(self.registry.ca))


@pytest.fixture
def user(
    registry: Registry,
    pushed: dict[str, str],
    clean_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Home:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return Home(registry, pushed["ready"], clean_home, bin_dir, tmp_path)


def test_creds_store_answers_for_the_registry(
    user: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    user.helper("vault", user.holds())
    # what `docker login` leaves with a credsStore: an empty placeholder under auths
    user.config({"credsStore": "vault", "auths": {user.registry.host: {}}})
    code, doc = user.scan(capsys)
    assert (code, doc["findings"]) == (0, [])
    assert user.asked() == [user.registry.host]


def test_cred_helpers_for_the_host_win_over_the_store(
    user: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    user.helper("ecr", user.holds())
    per_host = {"other.example": "absent", user.registry.host: "ecr"}
    user.config({"credsStore": "absent", "credHelpers": per_host})
    code, _ = user.scan(capsys)
    assert code == 0 and user.asked() == [user.registry.host]


def test_a_helper_without_the_host_means_anonymous_and_a_wrong_secret_is_named(
    user: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    user.helper("empty", user.holds().replace(user.registry.host, "elsewhere.example"))
    user.config({"credsStore": "empty"})
    assert "authentication failed anonymously" in user.error(capsys)
    user.helper("stale", user.holds(secret="expired"))
    config = user.config({"credsStore": "stale"})
    message = user.error(capsys)
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
    user: Home, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(credential_helpers, "HELPER_SECONDS", 1.0)
    script, said = FAILING[name]
    user.helper(name, script)
    config = user.config({"credHelpers": {user.registry.host: name}})
    message = user.error(capsys)
    assert f"docker-credential-{name} (named in {config})" in message
    assert said in message


def test_a_missing_helper_or_a_path_for_a_name_is_one_line(
    user: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    user.config({"credsStore": "osxkeychain"})
    message = user.error(capsys)
    assert "docker-credential-osxkeychain" in message and "is not on PATH" in message
    user.config({"credsStore": "../../bin/sh"})
    assert "not a credential helper name: '../../bin/sh'" in user.error(capsys)
