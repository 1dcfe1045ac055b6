"""A real CNCF distribution registry on loopback, with TLS and htpasswd auth, for tests.

The binary is built by dev/registry-tool.sh (`make test` runs it). Images are pushed with
skopeo from OCI layouts that tests/support/images/imagebuild.py writes. `CuttingProxy` sits in front
of the registry and closes the TCP connection once a response has passed a byte budget:
the registry that drops the connection mid-blob.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kube.apiserver import REPO, Proc, free_port, make_pki

USER, PASSWORD = "ci", "s3cret-for-tests"
TOKEN_SERVICE, TOKEN_ISSUER = "execwatch-registry", "execwatch-token-issuer"


def registry_binary() -> Path:
    path = Path(os.environ.get("EXECWATCH_REGISTRY_BIN", REPO / ".cache/registry-bin/registry"))
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"missing {path}: run dev/registry-tool.sh (make test runs it via dev/setup.sh --test)"
        )
    return path


def bcrypt_hash(password: str) -> str:
    with warnings.catch_warnings():  # crypt is deprecated, but libxcrypt's bcrypt is what we need
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


@dataclass
class Registry:
    """htpasswd (basic) auth by default; with `token_realm`, bearer tokens from that realm."""

    workdir: Path
    proc: Proc | None = None
    port: int = 0
    pki: Path = field(init=False)
    storage: Path | None = None  # default: workdir/data
    token_realm: str = ""
    token_cert: Path | None = None

    def __post_init__(self) -> None:
        self.pki = self.workdir / "pki"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def start(self) -> None:
        make_pki(self.pki)
        (self.workdir / "htpasswd").write_text(f"{USER}:{bcrypt_hash(PASSWORD)}\n")
        self.port = free_port()
        auth: dict[str, object] = {
            "htpasswd": {"realm": "execwatch-test", "path": str(self.workdir / "htpasswd")}
        }
        if self.token_realm:
            token = {"realm": self.token_realm, "service": TOKEN_SERVICE, "issuer": TOKEN_ISSUER,
                     "rootcertbundle": str(self.token_cert)}  # fmt: skip
            auth = {"token": token}
        config = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage or self.workdir / "data")}
            },
            "http": {
                "addr": self.host,
                "tls": {
                    "certificate": str(self.pki / "serving.crt"),
                    "key": str(self.pki / "serving.key"),
                },
            },
            "auth": auth,
        }
        self.proc = serve_registry(self.workdir, config)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if not self.proc.alive():
                raise RuntimeError(f"registry exited:\n{self.proc.tail()}")
            try:
                urllib.request.urlopen(f"https://{self.host}/v2/", context=ctx, timeout=2)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # up, and asking for credentials
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"registry not ready:\n{self.proc.tail() if self.proc else ''}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def auth_file(self, path: Path, *hosts: str, password: str = PASSWORD) -> Path:
        """A containers auth.json for `hosts` (default: this registry)."""
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        path.write_text(json.dumps({"auths": {h: {"auth": token} for h in hosts or [self.host]}}))
        return path

    def push(self, layout: Path, repo_tag: str, *, ref: str = "", v2s2: bool = False) -> str:
        """skopeo copy an OCI layout (every platform) to this registry; returns the reference."""
        certs = self.workdir / "skopeo-certs"
        certs.mkdir(exist_ok=True)
        (certs / "ca.crt").write_bytes(self.ca.read_bytes())
        dest = f"{self.host}/{repo_tag}"
        argv = ["skopeo", "copy", "--quiet", "--all", "--dest-cert-dir", str(certs)]
        argv += ["--dest-creds", f"{USER}:{PASSWORD}"]
        if v2s2:
            argv += ["--format", "v2s2"]
        source = f"oci:{layout}" + (f":{ref}" if ref else "")
        subprocess.run([*argv, source, f"docker://{dest}"], check=True, capture_output=True)
        return dest

    def manifest(self, repo_tag: str, put: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET an OCI manifest; or PUT `put` as it is (the blobs it names must be in the
        repository already), as a client that lies in its descriptors would."""
        repo, _, tag = repo_tag.partition(":")
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        media_type = "application/vnd.oci.image.manifest.v1+json"
        headers = {"Authorization": f"Basic {token}", "Accept": media_type}
        request = urllib.request.Request(
            f"https://{self.host}/v2/{repo}/manifests/{tag}",
            data=None if put is None else json.dumps(put).encode(),
            method="GET" if put is None else "PUT",
            headers=headers if put is None else {**headers, "Content-Type": media_type},
        )
        ctx = ssl.create_default_context(cafile=str(self.ca))
        with urllib.request.urlopen(request, context=ctx, timeout=30) as response:
            return put or dict(json.loads(response.read()))


def serve_registry(workdir: Path, config: dict[str, Any]) -> Proc:
    """distribution's registry started with `config`, its files and log in `workdir`."""
    (workdir / "config.yml").write_text(json.dumps(config))  # YAML is a JSON superset
    proc = Proc(
        "registry",
        [str(registry_binary()), "serve", str(workdir / "config.yml")],
        workdir / "registry.log",
    )
    proc.start()
    return proc


@contextlib.contextmanager
def running_registry(workdir: Path, **options: Any) -> Iterator[Registry]:
    registry = Registry(workdir, **options)
    try:
        registry.start()
        yield registry
    finally:
        registry.stop()


class CuttingProxy:
    """TCP proxy to `upstream` that closes a connection after `budget` bytes from upstream.

    TLS passes through untouched (the client still verifies the registry's certificate);
    the client sees the stream end in the middle of a response body.
    """

    def __init__(self, upstream: tuple[str, int], budget: int) -> None:
        self.upstream = upstream
        self.budget = budget
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cuts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, self.budget), daemon=True
            ).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, budget: int | None) -> None:
        passed = 0
        try:
            while data := src.recv(65536):
                if budget is not None and passed + len(data) > budget:
                    dst.sendall(data[: budget - passed])
                    self.cuts += 1
                    break
                dst.sendall(data)
                passed += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(timeout=5)


class TokenServer:
    """A Docker token server (distribution's `token` auth): basic credentials in, a JWT out.

    The JWT is RS256, signed by `openssl dgst` with a key whose self-signed certificate is
    the registry's `rootcertbundle`, and carries that certificate in its `x5c` header. A
    request without credentials gets a token with no access, as public registries do.
    """

    def __init__(self, workdir: Path, serving_pki: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        "token.key", "-out", "token.crt", "-days", "2", "-subj",
                        "/CN=execwatch-token-issuer"], cwd=workdir, check=True,
                       capture_output=True)  # fmt: skip
        self.cert = workdir / "token.crt"
        self.issued = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                header = self.headers.get("Authorization", "")
                access: list[dict[str, object]] = []
                if header:
                    user, _, password = base64.b64decode(header.split()[-1]).decode().partition(":")
                    if (user, password) != (USER, PASSWORD):
                        self.send_response(401)
                        self.end_headers()
                        return
                    for scope in query.get("scope", []):
                        kind, name, actions = scope.split(":")
                        access.append({"type": kind, "name": name, "actions": actions.split(",")})
                body = json.dumps({"token": server.token(user if header else "", access)})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(serving_pki / "serving.crt", serving_pki / "serving.key")
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.realm = f"https://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, subject: str, access: list[dict[str, object]]) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        der = ssl.PEM_cert_to_DER_cert(self.cert.read_text())
        header = {"alg": "RS256", "typ": "JWT", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {"iss": TOKEN_ISSUER, "sub": subject, "aud": TOKEN_SERVICE, "iat": now,
                  "nbf": now - 10, "exp": now + 300, "jti": str(now) + str(self.issued),
                  "access": access}  # fmt: skip
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.workdir / "token.key")],
            input=signing_input.encode(), capture_output=True, check=True,
        ).stdout  # fmt: skip
        self.issued += 1
        return f"{signing_input}.{b64(signature)}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass(frozen=True)
class TokenRegistry:
    registry: Registry
    tokens: TokenServer


@contextlib.contextmanager
def running_token_registry(origin: Registry, work: Path) -> Iterator[TokenRegistry]:
    """A second registry on `origin`'s storage that wants bearer tokens from a token
    server, as public registries do. Its ca.crt also holds `origin`'s CA, which signs the
    token server's certificate: one CA file trusts the registry and its token server."""
    tokens = TokenServer(work / "token-issuer", origin.pki)
    options = {"storage": origin.workdir / "data", "token_realm": tokens.realm,
               "token_cert": tokens.cert}  # fmt: skip
    try:
        with running_registry(work / "token-registry", **options) as made:
            made.ca.write_text(made.ca.read_text() + origin.ca.read_text())
            yield TokenRegistry(made, tokens)
    finally:
        tokens.close()


@dataclass
class Blob:
    """A blob as a hostile registry serves it: `data` sent `repeat` times, with or without
    a Content-Length (without one, the body ends when the connection closes)."""

    data: bytes
    repeat: int = 1
    length: bool = True
    delay: float = 0.0  # seconds between two `data`: a registry that drips


class HostileRegistry:
    """A registry over plain HTTP that serves whatever a test gives it: manifests naming any
    digest, blobs longer than their descriptors say. No real registry accepts such a push;
    a compromised or malicious one serves it all the same. Records every path asked for and
    the bytes of each blob it got out before the client hung up."""

    def __init__(self) -> None:
        self.manifests: dict[str, tuple[str, bytes]] = {}  # "repo/ref" -> (type, body)
        self.blobs: dict[str, Blob] = {}  # digest -> body
        self.requested: list[str] = []
        self.sent: dict[str, int] = {}
        self.heads: dict[str, str] = {}  # "repo/ref" -> the digest a HEAD announces
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                registry.requested.append("HEAD " + self.path)
                rest, _, ref = self.path.removeprefix("/v2/").rpartition("/")
                name = rest.removesuffix("/manifests")
                digest = registry.heads.get(f"{name}/{ref}")
                if digest is None and f"{name}/{ref}" in registry.manifests:
                    body = registry.manifests[f"{name}/{ref}"][1]
                    digest = "sha256:" + hashlib.sha256(body).hexdigest()
                self.send_response(404 if digest is None else 200)
                if digest is not None:
                    self.send_header("Docker-Content-Digest", digest)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                registry.requested.append(self.path)
                rest, _, ref = self.path.removeprefix("/v2/").rpartition("/")
                name, _, kind = rest.rpartition("/")
                if kind == "manifests" and f"{name}/{ref}" in registry.manifests:
                    media_type, body = registry.manifests[f"{name}/{ref}"]
                    self._send(Blob(body), media_type, ref)
                elif kind == "blobs" and ref in registry.blobs:
                    self._send(registry.blobs[ref], "application/octet-stream", ref)
                else:
                    self.send_response(404 if self.path != "/v2/" else 200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def _send(self, blob: Blob, media_type: str, key: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", media_type)
                if blob.length:
                    self.send_header("Content-Length", str(len(blob.data) * blob.repeat))
                self.end_headers()
                registry.sent[key] = 0
                with contextlib.suppress(OSError):
                    for _ in range(blob.repeat):
                        self.wfile.write(blob.data)
                        self.wfile.flush()
                        registry.sent[key] += len(blob.data)
                        time.sleep(blob.delay)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def blob(self, data: bytes, media_type: str, **how: Any) -> dict[str, Any]:
        """Serve `data` (as `how` says); its descriptor, with the size of `data`."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = Blob(data, **how)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, repo_tag: str, config: dict[str, Any], layers: list[dict[str, Any]]) -> str:
        """An OCI manifest of `config` and the layer descriptors given as they are; the
        reference to it."""
        media_type = "application/vnd.oci.image.manifest.v1+json"
        config_desc = self.blob(
            json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"
        )
        manifest = {"schemaVersion": 2, "mediaType": media_type, "config": config_desc,
                    "layers": layers}  # fmt: skip
        repo, _, tag = repo_tag.partition(":")
        self.manifests[f"{repo}/{tag}"] = (media_type, json.dumps(manifest).encode())
        return f"{self.host}/{repo_tag}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
