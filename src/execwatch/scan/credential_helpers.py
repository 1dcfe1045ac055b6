"""Docker credential helpers: `docker-credential-NAME get`, the registry host on stdin, a
JSON object `{"ServerURL", "Username", "Secret"}` on stdout (docker/docker-credential-helpers).

The helper is the user's own program (a keychain, `pass`, a cloud provider's token tool),
named in their config.json, but what it prints is still read on a budget: HELPER_SECONDS
to answer and HELPER_BYTES of output, then it is killed. "credentials not found" is no
error (anonymous access, or the next credentials file); any other failure is one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import time

from execwatch.scan.errors import ScanInputError

HELPER_SECONDS = 10.0
HELPER_BYTES = 64 << 10
NOT_FOUND = "credentials not found in native keychain"  # the protocol's "no entry" answer
IDENTITY_TOKEN = "<token>"  # Username of an OAuth2 refresh token (docker login --identity-token)


class CredentialHelperError(ScanInputError):
    """A credential helper was missing, failed, was too slow or answered nonsense."""


def get(name: str, server: str, source: str) -> tuple[str, str] | None:
    """(username, secret) the helper holds for `server`, or None when it holds none."""
    program = f"docker-credential-{name}"
    where = f"{program} (named in {source})"
    path = shutil.which(program)
    if path is None:
        raise CredentialHelperError(f"credential helper {where} is not on PATH")
    code, out, err = _run([path, "get"], server.encode(), where)
    text = out.decode(errors="replace").strip()
    if code != 0:
        if NOT_FOUND in text:
            return None
        detail = err.decode(errors="replace").strip() or text or f"exit status {code}"
        raise CredentialHelperError(f"credential helper {where} failed: {_line(detail)}")
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    user = doc.get("Username") if isinstance(doc, dict) else None
    secret = doc.get("Secret") if isinstance(doc, dict) else None
    if not isinstance(user, str) or not isinstance(secret, str):
        raise CredentialHelperError(
            f"credential helper {where} did not answer with JSON Username and Secret"
        )
    if user == IDENTITY_TOKEN:
        raise CredentialHelperError(
            f"credential helper {where} holds an identity token for {server}: not supported"
            " (log in with a username and password or a registry token)"
        )
    return user, secret


def _run(argv: list[str], stdin: bytes, where: str) -> tuple[int, bytes, bytes]:
    """Run, feed stdin, read stdout and stderr within HELPER_BYTES and HELPER_SECONDS."""
    deadline = time.monotonic() + HELPER_SECONDS
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a slow helper is killed with what it started
        )
    except OSError as exc:
        raise CredentialHelperError(f"credential helper {where}: {exc.strerror}") from exc
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        with contextlib.suppress(BrokenPipeError):  # it exited unread: its status says why
            proc.stdin.write(stdin)  # a host name: far below a pipe's buffer
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        output = {proc.stdout: bytearray(), proc.stderr: bytearray()}
        with selectors.DefaultSelector() as selector:
            for stream in output:
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CredentialHelperError(
                        f"credential helper {where} did not answer within {HELPER_SECONDS:g} s"
                    )
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    output[key.fileobj] += chunk  # type: ignore[index]
                    if sum(map(len, output.values())) > HELPER_BYTES:
                        raise CredentialHelperError(
                            f"credential helper {where} wrote more than {HELPER_BYTES} bytes"
                        )
        try:
            code = proc.wait(max(deadline - time.monotonic(), 0.001))
        except subprocess.TimeoutExpired as exc:
            raise CredentialHelperError(
                f"credential helper {where} did not exit within {HELPER_SECONDS:g} s"
            ) from exc
        return code, bytes(output[proc.stdout]), bytes(output[proc.stderr])
    finally:
        if proc.poll() is None:
            _kill(proc)
        proc.stdout.close()
        proc.stderr.close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _line(text: str) -> str:
    return text.splitlines()[0][:200] if text else text
