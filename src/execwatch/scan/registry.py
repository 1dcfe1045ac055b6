"""Images straight from an OCI/Docker registry, following the OCI distribution spec.

The HTTP side is requests, over a Session whose connections obey the egress and deadline
of scan.guard: each request goes to the repository's /v2/ path with the Authorization
that answered the registry's `WWW-Authenticate` challenge (a bearer token for pull from
the challenge's realm, or basic), verifies TLS against a given CA and speaks plain HTTP
only when asked, never with credentials. This module adds what a scanner needs on top:
reference parsing, the Docker/Podman credential files, bounded and digest-checked
manifests, blobs streamed and checked against their descriptor's size and digest, and a
bounded on-disk blob cache keyed by registry, repository and digest, so that a layer
shared by several platforms, or met again in a later scan, is fetched once.

What a registry can make a long-lived resolver (placement) do is bounded too: manifests and
configs go through the token-bounded JSON parser, at most `Limits.max_resolution_bytes` of
them per resolution, of the platforms asked for only; `resolve_images` runs under a hard
deadline (scan.egress.Deadline); no redirect of a manifest or a token is followed, a blob's
only to https; a non-global destination is refused unless allowed (scan.egress.Egress); a
failure is named by its class, never by what the registry answered.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlparse, urlunparse

from execwatch import cliargs
from execwatch.binfmt import Platform
from execwatch.runnable.limits import Limits
from execwatch.scan.bounded import parse_json
from execwatch.scan.egress import Deadline, Egress, EgressRefused
from execwatch.scan.errors import LimitExceeded, ScanInputError
from execwatch.scan.model import ImageResult
from execwatch.scan.oci import walk
from execwatch.scan.reuse import (
    BASIC_TTL,
    Content,
    ContentMemo,
    RegistryReuse,
    new_session,
    token_ttl,
)
from execwatch.scan.sources import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    ImageSource,
    check_digest,
    valid_digest,
)

if TYPE_CHECKING:  # requests is imported when a registry is asked: not at start-up
    import requests


class RegistryError(ScanInputError):
    """The registry could not be read: authentication, TLS, network, HTTP status, digest."""


DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
ACCEPT = ", ".join(sorted(INDEX_TYPES | MANIFEST_TYPES))
CHUNK = 1 << 20
MAX_TOKEN_BYTES = 256 << 10
USER_AGENT = "Docker-Client/19.03.2 (linux)"  # of token requests and redirected blobs
DEFAULT_CACHE_BYTES = 2 << 30
TIMEOUT_SECONDS = 30.0
# how a registry failure is named (an Event quotes it): its class, never what was answered
REGISTRY_TIMED_OUT = "registry timed out"
REDIRECT_REFUSED = "the registry answered with a redirect, which is not followed"
DESTINATION_REFUSED = "registry destination refused"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*)"
    r"(?::[0-9]+)?"
)
_REFERENCE = re.compile(
    rf"^(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}))?$"
)


@dataclass(frozen=True)
class Reference:
    """`host[:port]/repo[:tag][@sha256:…]`, normalised as the Docker CLI does."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> Reference:
        raw = text.removeprefix("docker://")
        m = _REFERENCE.match(raw)
        if m is None or len(raw) > 512:
            raise ScanInputError(f"{text}: not a valid image reference")
        name = m.group("name")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, repository = first, rest
        else:
            registry, repository = DOCKER_HUB, name
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        tag = m.group("tag") or (None if m.group("digest") else "latest")
        return cls(registry, repository, tag, m.group("digest"))

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{digest}"


def looks_like_reference(target: str) -> bool:
    """A target that is no local path is a registry reference if it names its registry."""
    if target.startswith("docker://"):
        return True
    first, _, rest = target.partition("/")
    names_host = "." in first or ":" in first or first == "localhost"
    return bool(rest) and names_host and re.fullmatch(_DOMAIN, first) is not None


@dataclass
class RegistryOptions:
    config_files: list[str] = field(default_factory=list)  # --registry-config, searched first
    ca_file: str | None = None
    insecure: frozenset[str] = frozenset()  # hosts spoken to over plain HTTP
    cache_dir: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    timeout: float = TIMEOUT_SECONDS
    # a long-lived process's memo, auth cache and sessions (placement); None: nothing kept
    reuse: RegistryReuse | None = None
    # destinations connections may reach (placement); None: any (the command line's scans)
    egress: Egress | None = None
    # seconds one resolution (`resolve_images`) may take, whatever the registry does
    deadline: float | None = None


def add_arguments(
    p: argparse.ArgumentParser, *, credentials: bool = True, private_networks: bool = False
) -> None:
    """The registry options of every command that reads registries (scan, audit, placement),
    each defined here only. `credentials`: the credential-file option (placement has none:
    pods pull with their own secrets); `private_networks`: the egress option of a long-lived
    resolver (placement), which refuses every other non-global address."""
    g = p.add_argument_group("registries")
    if credentials:
        g.add_argument(
            "--registry-config",
            type=cliargs.readable_file,
            action="append",
            default=[],
            metavar="FILE",
            help="credentials file (Docker config.json or containers auth.json), read before"
            " the standard ones",
        )
    g.add_argument(
        "--registry-ca",
        type=cliargs.readable_file,
        metavar="FILE",
        help="PEM CA bundle for registry TLS",
    )
    g.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="speak plain HTTP to this registry (never sends credentials)",
    )
    if private_networks:
        g.add_argument(
            "--registry-allow-private",
            type=cliargs.network,
            action="append",
            default=[],
            metavar="CIDR",
            help="a loopback, link-local or private network registries may be reached in"
            " (every other non-global address is refused, redirects and token realms included)",
        )
    g.add_argument(
        "--cache-dir", metavar="DIR", help="blob cache (default ~/.cache/execwatch/registry)"
    )
    g.add_argument(
        "--cache-size",
        type=cliargs.size,
        default=DEFAULT_CACHE_BYTES,
        metavar="BYTES",
        help="bound of the blob cache, e.g. 2G; 0 disables it (default 2G)",
    )


def options_from(args: argparse.Namespace) -> RegistryOptions:
    """The options `add_arguments` defined, as parsed; with `--registry-allow-private`, the
    egress it allows (any other non-global destination refused)."""
    allowed = getattr(args, "registry_allow_private", None)
    return RegistryOptions(
        config_files=list(getattr(args, "registry_config", [])),
        ca_file=args.registry_ca,
        insecure=frozenset(args.insecure_registry),
        cache_dir=args.cache_dir,
        cache_bytes=args.cache_size,
        egress=Egress(tuple(allowed)) if allowed is not None else None,
    )


# --- credentials -------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str
    source: str  # the file, and the helper that answered for it


def credential_files(explicit: list[str]) -> list[str]:
    """Where Podman and Docker look, in the order skopeo/podman use them, after `explicit`."""
    env = os.environ
    home = os.path.expanduser("~")
    files = list(explicit)
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(env["REGISTRY_AUTH_FILE"])
    if env.get("XDG_RUNTIME_DIR"):
        files.append(os.path.join(env["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    files.append(os.path.join(home, ".config", "containers", "auth.json"))
    files.append(
        os.path.join(env.get("DOCKER_CONFIG") or os.path.join(home, ".docker"), "config.json")
    )
    return files


def find_credentials(ref: Reference, files: list[str], limits: Limits) -> Credentials | None:
    """From the first file that has credentials for the registry: its credential helper for
    the host (`credHelpers`), else its default one (`credsStore`), as Docker runs them, else
    the most specific `auths` entry (host, host/namespace, host/repo)."""
    from execwatch.scan import credential_helpers  # subprocess: not at start-up

    for path in files:
        config = _config(path, limits)
        helper = _helper_name(config, ref, path)
        if helper is not None:
            pair = credential_helpers.get(helper, _server_address(ref), path)
            if pair is not None:
                return Credentials(*pair, f"{path}, docker-credential-{helper}")
            continue  # the helper has nothing for this host: Docker's `auths` are placeholders
        auths = config.get("auths", {})
        auths = auths if isinstance(auths, dict) else {}
        best: tuple[int, dict[str, Any]] | None = None
        for key, entry in auths.items():
            scope = _auth_key(key)
            full = f"{ref.registry}/{ref.repository}"
            matches = full == scope or full.startswith(scope + "/")
            if isinstance(entry, dict) and matches and (best is None or len(scope) > best[0]):
                best = (len(scope), entry)
        if best is not None:
            return _decode(best[1], path)
    return None


def _config(path: str, limits: Limits) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(limits.max_json_bytes + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ScanInputError(f"{path}: {exc.strerror}") from exc
    try:
        doc = json.loads(raw) if len(raw) <= limits.max_json_bytes else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ScanInputError(f"{path}: not a credentials file (JSON object)")
    return doc


def _helper_name(config: dict[str, Any], ref: Reference, path: str) -> str | None:
    """`credHelpers` names a helper per registry host; `credsStore` one for every host."""
    per_host = config.get("credHelpers")
    name = None
    if isinstance(per_host, dict):
        name = next((v for k, v in per_host.items() if _auth_key(k) == ref.registry), None)
    name = name or config.get("credsStore") or None
    valid = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # a program-name suffix, never a path
    if name is not None and not (isinstance(name, str) and re.fullmatch(valid, name)):
        raise ScanInputError(f"{path}: not a credential helper name: {str(name)[:64]!r}")
    return name


def _server_address(ref: Reference) -> str:
    """What `docker login` stored the credentials under: Docker Hub's v1 URL, else the host."""
    return "https://index.docker.io/v1/" if ref.registry == DOCKER_HUB else ref.registry


def _auth_key(key: str) -> str:
    key = re.sub(r"^[a-z]+://", "", key).rstrip("/")
    key = key.removesuffix("/v1").removesuffix("/v2")
    return DOCKER_HUB if key in ("index.docker.io", "registry-1.docker.io") else key


def _decode(entry: dict[str, Any], path: str) -> Credentials:
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise ScanInputError(f"{path}: an auth entry is not base64 of user:password")
        return Credentials(user, password, path)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str):
        return Credentials(name, secret, path)
    raise ScanInputError(f"{path}: an auth entry has neither auth nor username/password")


# --- blob cache ----------------------------------------------------------------------------


class BlobCache:
    """Verified blobs by registry, repository and digest, at most `max_bytes` in total,
    least recently used evicted.

    Each repository of each registry has a directory of its own (a hash of both names): a
    blob is served from the cache only to a client of the repository that served it, so
    a registry that names someone else's digest still has to serve its bytes. A path is
    only ever built from a digest of the OCI form (so it names a file directly in
    blobs/<scope>/<algorithm>/), and only a regular file is opened there, without
    following a symlink: a digest from a registry cannot make the cache read or touch
    anything else.
    """

    ALGORITHMS = ("sha256", "sha512")

    def __init__(self, root: str, max_bytes: int, scope: str) -> None:
        self.root = os.path.join(root, "blobs")
        self.scope = hashlib.sha256(scope.encode()).hexdigest()[:32]
        self.max_bytes = max_bytes

    def path(self, digest: str) -> str:
        algorithm, hexdigest = valid_digest(digest, "blob cache").split(":", 1)
        directory = os.path.join(self.root, self.scope, algorithm)
        path = os.path.join(directory, hexdigest)
        if os.path.dirname(os.path.normpath(path)) != os.path.normpath(directory):
            raise ScanInputError(f"blob cache: {digest[:80]!r} names a path outside the cache")
        return path

    def open(self, digest: str, size: int) -> IO[bytes] | None:
        """The cached blob, if it is a regular file of the declared size."""
        try:
            fd = os.open(self.path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            return None
        os.utime(fd)  # mark as recently used
        return os.fdopen(fd, "rb")

    def writer(self, digest: str, size: int) -> IO[bytes] | None:
        if size > self.max_bytes:
            return None
        directory = os.path.dirname(self.path(digest))
        os.makedirs(directory, exist_ok=True)
        return tempfile.NamedTemporaryFile(dir=directory, prefix=".part-", delete=False)

    def commit(self, tmp: IO[bytes], digest: str) -> None:
        tmp.close()
        os.replace(tmp.name, self.path(digest))
        self._evict()

    def _evict(self) -> None:
        entries = []
        for directory in self._directories():
            with os.scandir(directory) as it:
                for e in it:
                    if not e.name.startswith(".") and e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        entries.append((st.st_mtime, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            os.unlink(path)
            total -= size

    def _directories(self) -> list[str]:
        """blobs/<scope>/<algorithm> of every scope."""
        try:
            scopes = [e.path for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        found = [os.path.join(scope, a) for scope in scopes for a in self.ALGORITHMS]
        return [d for d in found if os.path.isdir(d) and not os.path.islink(d)]


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "execwatch", "registry")


# --- the registry client -------------------------------------------------------------------


@dataclass
class FetchStats:
    """What a registry scan cost: bytes over the network, from the cache, and the image size."""

    fetched: int = 0
    cached: int = 0
    layer_bytes: dict[str, int] = field(default_factory=dict)  # digest -> size, all platforms


class RegistryClient:
    """One repository of one registry; every failure becomes a one-line ScanInputError.

    With `options.reuse` (a long-lived process, `scan.reuse`): requests go over the pooled
    Session of the registry host and this credential, the Authorization header that worked
    for the same host, repository and credential is sent first, and manifests and JSON
    blobs named by digest come from the memo once verified."""

    def __init__(self, ref: Reference, options: RegistryOptions, limits: Limits) -> None:
        self.ref = ref
        self.limits = limits
        self.stats = FetchStats()
        self.insecure = ref.registry in options.insecure
        self.verify: bool | str = options.ca_file or True
        self.timeout = options.timeout
        self.credentials = find_credentials(ref, credential_files(options.config_files), limits)
        self.cache = (
            BlobCache(
                options.cache_dir or default_cache_dir(),
                options.cache_bytes,
                f"{ref.api_host}/{ref.repository}",
            )
            if options.cache_bytes > 0
            else None
        )
        scheme = "http" if self.insecure else "https"
        self.base = f"{scheme}://{ref.api_host}/v2/{ref.repository}/"
        self.authorization: str | None = None  # the header sent with every registry request
        self.reuse = options.reuse.here() if options.reuse else None
        self.egress = options.egress
        self.deadline_s = options.deadline
        self.deadline: Deadline | None = None  # of the resolution under way
        self.spent = 0  # bytes of manifests and configs read (Limits.max_resolution_bytes)
        self._pid = os.getpid()
        self.who = ""  # the credential's key in the auth cache and the session pool
        if self.reuse is None:
            self.session = new_session(1)
        else:
            creds = self.credentials
            self.who = self.reuse.credential_key(
                creds.username if creds else None, creds.password if creds else None
            )
            self.session = self.reuse.sessions.get((ref.api_host, self.who))
            self.authorization = self.reuse.auth.get(self._auth_key())

    def _auth_key(self) -> tuple[str, str, str]:
        return (self.ref.api_host, self.ref.repository, self.who)

    def _shared(self) -> RegistryReuse | None:
        """The process's memo, auth cache and sessions; None without, and in a forked child
        (the scan's process), which then opens connections of its own: its parent's pooled
        ones are the same sockets (its own Session's too: a TLS connection two processes
        write to breaks), and their locks may have been held at the fork."""
        if os.getpid() != self._pid:
            self.reuse, self._pid = None, os.getpid()
            self.session = new_session(1)
        return self.reuse

    @contextlib.contextmanager
    def resolution(self) -> Iterator[None]:
        """One resolution under `options.deadline`: past it, its connections are shut down
        and it fails as timed out, whatever it was waiting for."""
        if self.deadline_s is None:
            yield
            return
        deadline = self.deadline = Deadline(self.deadline_s)
        try:
            with deadline.armed():
                yield
        except Exception as exc:
            if deadline.fired:
                raise RegistryError(
                    f"{self.ref}: {REGISTRY_TIMED_OUT} (no answer within {self.deadline_s:g} s)"
                ) from exc
            raise
        finally:
            self.deadline = None

    def _guarded(self, session: Any) -> contextlib.AbstractContextManager[None]:
        """The egress and the deadline applied to this thread's requests over `session`."""
        from execwatch.scan.guard import watch_of

        return watch_of(session).applying(self.deadline, self.egress)

    def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, stream: bool = False
    ) -> requests.Response:
        """A request to the repository's `path` (`manifests/…`, `blobs/…`); a 401 answered
        (`_authenticate`) and the request sent again once when that changed the header; a
        redirect returned, never followed; another error status raised."""
        self._shared()
        sent = self.authorization
        r = self._send(method, path, headers, stream)
        if r.status_code == 401:
            r.close()
            self._authenticate(r)
            if self.authorization != sent:
                r = self._send(method, path, headers, stream)
        if r.status_code == 401:
            r.close()
            raise Unauthorized()
        if r.status_code >= 400:
            r.close()
        r.raise_for_status()
        return r

    def _send(
        self, method: str, path: str, headers: dict[str, str] | None, stream: bool
    ) -> requests.Response:
        headers = dict(headers or {})
        if self.authorization:
            headers["Authorization"] = self.authorization
        with self._guarded(self.session):
            return self.session.request(
                method,
                self.base + path,
                headers=headers,
                verify=self.verify,
                timeout=self.timeout,
                stream=stream,
                allow_redirects=False,
            )

    def _not_redirected(self, r: requests.Response, what: str) -> requests.Response:
        if 300 <= r.status_code < 400:
            r.close()
            raise RegistryError(f"{self.ref}: {what}: {REDIRECT_REFUSED}")
        return r

    def _authenticate(self, response: requests.Response) -> None:
        """Answer a 401: a bearer token from the challenge's realm for pull on this
        repository, or basic auth; with the auth cache, what worked is kept for this host,
        repository and credential only. Credentials never go over plain HTTP."""
        if self.insecure:
            raise CredentialsOverHTTP()
        creds = self.credentials
        user, password = (creds.username, creds.password) if creds else (None, None)
        shared = self._shared()
        challenge = _challenge(response)
        if challenge is None:
            raise Unauthorized()
        if shared is not None:
            shared.auth.forget(self._auth_key())
        if "bearer" in challenge:
            header, ttl = self._token(challenge["bearer"], user, password)
        elif user is not None and password is not None:
            header, ttl = _basic(user, password), BASIC_TTL
        else:
            return  # anonymous: nothing to answer a basic challenge with
        self.authorization = header
        if shared is not None:
            shared.auth.put(self._auth_key(), header, ttl)

    def _token(
        self, info: dict[str, str], user: str | None, password: str | None
    ) -> tuple[str, float]:
        """A bearer token for pulling this repository, and how long it may be sent."""
        realm = info.get("realm")
        if not realm:
            raise RegistryError(f"{self.ref}: the registry's bearer challenge names no realm")
        parts = urlparse(realm)
        query = parse_qsl(parts.query)
        if "service" in info:
            query.append(("service", info["service"]))
        query.append(("scope", f"repository:{self.ref.repository}:pull"))
        headers = {"User-Agent": USER_AGENT}
        if user is not None and password is not None:
            headers["Authorization"] = _basic(user, password)
        # https whatever the realm says: credentials never go plain
        url = urlunparse(("https", parts.netloc, parts.path, parts.params, urlencode(query), ""))
        deadline = time.monotonic() + self.timeout
        with self._guarded(self.session):
            r = self.session.get(
                url,
                headers=headers,
                verify=self.verify,
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,  # a redirect would carry the token to where it points
            )
        with r:
            if r.status_code == 401:
                raise Unauthorized()
            self._not_redirected(r, "the token server")
            r.raise_for_status()
            raw = _read_capped(r, MAX_TOKEN_BYTES + 1, deadline, self.ref)
        try:
            doc = parse_json(raw, "token", self.limits) if len(raw) <= MAX_TOKEN_BYTES else None
        except ScanInputError:
            doc = None
        token = (doc.get("access_token") or doc.get("token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token.isprintable():
            raise RegistryError(f"{self.ref}: the token server's answer holds no token")
        assert isinstance(doc, dict)
        return f"Bearer {token}", token_ttl(doc.get("expires_in"))

    def top(self) -> tuple[dict[str, Any], str]:
        """The manifest or index the reference names, and its digest.

        With the memo, one HEAD with this client's credentials says which digest the
        reference names now (a tag may have moved; it is never kept), and the body comes
        from the memo when that digest was verified before; else it is fetched by digest."""
        wanted = self.ref.digest or str(self.ref.tag)
        if self._memo() is None:
            return self.manifest(wanted)
        digest = self.head(wanted)
        return self.manifest(digest or wanted)

    def head(self, reference: str) -> str | None:
        """The digest the registry names for `reference` (a digest is returned as it is,
        once the registry has answered for it); None when it names none usable."""
        if ":" in reference:
            valid_digest(reference, f"{self.ref}: manifest")
        with self.translating(f"manifest {reference}"):
            r = self._request("head", "manifests/" + reference, headers={"Accept": ACCEPT})
            r.close()
        self._not_redirected(r, f"manifest {reference}")
        if ":" in reference:
            return reference
        announced = r.headers.get("Docker-Content-Digest", "")
        return announced if re.fullmatch(r"sha256:[a-f0-9]{64}", announced) else None

    def _memo(self) -> ContentMemo | None:
        shared = self._shared()
        return shared.memo if shared is not None else None

    def manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        """A manifest or index by tag or digest, bounded, checked against a requested digest
        (and against the registry's Docker-Content-Digest when fetched by tag)."""
        memo = self._memo()
        if ":" in reference:  # a digest (a tag has no colon): checked before it makes a URL
            valid_digest(reference, f"{self.ref}: manifest")
            kept = memo.get(self._memo_key(reference)) if memo is not None else None
            if kept is not None:
                self._spend(len(kept.raw))
                return self._parse(kept, reference), reference
        deadline = time.monotonic() + self.limits.max_image_seconds
        with self.translating(f"manifest {reference}"):
            r = self._request(
                "get", "manifests/" + reference, headers={"Accept": ACCEPT}, stream=True
            )
            with self._not_redirected(r, f"manifest {reference}"):
                room = self._room(self.limits.max_json_bytes)
                raw = _read_capped(r, room + 1, deadline, self.ref)
                media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
                announced = r.headers.get("Docker-Content-Digest", "")
        if len(raw) > self.limits.max_json_bytes:
            raise ScanInputError(f"{self.ref}: manifest larger than {self.limits.max_json_bytes}")
        self._spend(len(raw))
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        if ":" in reference:
            check_digest(raw, reference, f"{self.ref}: manifest")
            digest = reference
        elif announced.startswith("sha256:") and announced != digest:
            raise RegistryError(
                f"{self.ref}: manifest {reference} does not match the digest the registry"
                f" names for it ({announced[:80]})"
            )
        content = Content(raw, media_type)
        doc = self._parse(content, reference)
        if memo is not None:
            memo.put(self._memo_key(digest), content)
        self.stats.fetched += len(raw)
        return doc, digest

    def _memo_key(self, digest: str) -> str:
        """Content is kept per registry and repository: a digest one repository served is
        never content another registry or repository is taken to have (one that answers a
        HEAD with someone else's digest must still serve the bytes)."""
        return f"{self.ref.api_host}/{self.ref.repository}@{digest}"

    def _room(self, most: int) -> int:
        """What is left of the resolution's bytes, at most `most`."""
        return max(0, min(most, self.limits.max_resolution_bytes - self.spent))

    def _spend(self, n: int) -> None:
        self.spent += n
        if self.spent > self.limits.max_resolution_bytes:
            raise LimitExceeded(
                f"{self.ref}: manifests and configs larger than"
                f" {self.limits.max_resolution_bytes} bytes in all"
            )

    def _parse(self, content: Content, reference: str) -> dict[str, Any]:
        doc = parse_json(content.raw, f"{self.ref}: manifest {reference[:80]}", self.limits)
        if not isinstance(doc, dict):
            raise ScanInputError(f"{self.ref}: manifest {reference} is not an object")
        if not isinstance(doc.get("mediaType"), str) and content.media_type:
            doc["mediaType"] = content.media_type
        return doc

    def json_blob(self, digest: str, size: int) -> Any:
        if size > self.limits.max_json_bytes:
            raise ScanInputError(
                f"{self.ref}: blob {digest[:80]} larger than {self.limits.max_json_bytes}"
            )
        if size > self._room(size):
            self._spend(size)  # fails: past the resolution's bytes
        memo = self._memo()
        kept = memo.get(self._memo_key(digest)) if memo is not None else None
        if kept is not None and len(kept.raw) == size:
            raw = kept.raw
        else:
            with self.open_blob(digest, size) as f:
                raw = f.read(size + 1)
            check_digest(raw, digest, f"{self.ref}: blob")  # a cached copy is checked too
            if memo is not None:
                memo.put(self._memo_key(digest), Content(raw, ""))
        self._spend(len(raw))
        return parse_json(raw, f"{self.ref}: blob {digest[:80]}", self.limits)

    def open_blob(self, digest: str, size: int) -> IO[bytes]:
        """The blob's bytes as a stream: from the cache, or from the registry through it.

        Never more than `size` (the descriptor's) + 1 bytes are read: a blob that runs
        past its declared size fails there, before the cache or the scan gets more."""
        valid_digest(digest, f"{self.ref}: blob")
        cached = self.cache.open(digest, size) if self.cache else None
        if cached is not None:
            self.stats.cached += size
            return cached
        with self.translating(f"blob {digest[:19]}"):
            r = self._request("get", "blobs/" + digest, stream=True)
            if 300 <= r.status_code < 400:
                r = self._redirected_blob(r, digest)
        announced = r.headers.get("Content-Length", "")
        encoded = r.headers.get("Content-Encoding", "identity") != "identity"
        if announced.isdigit() and int(announced) != size and not encoded:
            r.close()
            raise RegistryError(
                f"{self.ref}: blob {digest[:19]} is {announced} bytes, its descriptor says {size}"
            )
        tee = self.cache.writer(digest, size) if self.cache else None
        return _BlobStream(r, self, digest, size, tee)  # type: ignore[return-value]

    def _redirected_blob(self, r: requests.Response, digest: str) -> requests.Response:
        """Where the registry sends a blob (object storage): https only, one hop, without
        the registry's credentials; the bytes are checked against the digest all the same."""
        location = r.headers.get("Location", "")
        r.close()
        url = urljoin(r.url, location)
        if urlparse(url).scheme != "https":
            raise RegistryError(
                f"{self.ref}: blob {digest[:19]}: the registry redirected it to a non-https"
                " address, which is not followed"
            )
        with self._guarded(self.session):
            got: requests.Response = self.session.get(
                url,
                headers={"User-Agent": USER_AGENT},
                verify=self.verify,
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,
            )
        self._not_redirected(got, f"blob {digest[:19]}")
        got.raise_for_status()
        return got

    def translating(self, what: str) -> _Translate:
        return _Translate(self.ref, what, self.credentials)


class Unauthorized(Exception):
    """The registry answered HTTP 401 to the credentials sent, or to none."""


class CredentialsOverHTTP(Exception):
    """A registry spoken to over plain HTTP asked for credentials."""


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _challenge(response: requests.Response) -> dict[str, dict[str, str]] | None:
    """The 401's WWW-Authenticate, by scheme in lower case; None when it has none."""
    import www_authenticate  # type: ignore[import-untyped]

    header = response.headers.get("WWW-Authenticate")
    if not header:
        return None
    try:
        parsed = www_authenticate.parse(header)
    except ValueError:
        return None
    return {str(k).lower(): dict(v or {}) for k, v in parsed.items()}


class _Translate:
    """requests exceptions -> one line a user can act on."""

    def __init__(self, ref: Reference, what: str, creds: Credentials | None) -> None:
        self.ref, self.what, self.creds = ref, what, creds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, ScanInputError):
            return
        message = describe_error(exc, self.ref, self.creds)
        if message is not None:
            raise RegistryError(f"{self.ref}: {self.what}: {message}") from exc


def describe_error(exc: BaseException, ref: Reference, creds: Credentials | None) -> str | None:
    """The class of a registry failure, in words a user can act on: never the exception's
    own text, which may quote what a registry, or a redirect it chose, answered."""
    import requests
    import urllib3

    if isinstance(exc, Unauthorized):
        who = f"as {creds.username} (from {creds.source})" if creds else "anonymously"
        return f"authentication failed {who}"
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 403:
            return "access denied (HTTP 403)"
        if status == 404:
            return "not found in the registry (HTTP 404)"
        return f"registry answered HTTP {status}"
    if isinstance(exc, EgressRefused):
        return f"{DESTINATION_REFUSED}: {exc.kind} address, not an allowed private network"
    if isinstance(exc, requests.exceptions.TooManyRedirects):
        return REDIRECT_REFUSED
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS failure talking to the registry {ref.api_host} (use --registry-ca FILE)"
    if isinstance(exc, requests.Timeout | urllib3.exceptions.ReadTimeoutError | TimeoutError):
        return REGISTRY_TIMED_OUT
    if isinstance(exc, requests.RequestException | urllib3.exceptions.HTTPError | OSError):
        return _connection_failure(exc)
    if isinstance(exc, CredentialsOverHTTP):
        return "the registry wants credentials, which are never sent over plain HTTP"
    return None


def _connection_failure(exc: BaseException) -> str:
    """What went wrong with the connection, by the first cause that names it."""
    import socket
    import ssl

    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(seen) < 16:
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__ or _reason(cause)
    for each in seen:
        if isinstance(each, EgressRefused):
            return f"{DESTINATION_REFUSED}: {each.kind} address, not an allowed private network"
        if isinstance(each, ConnectionRefusedError):
            return "connection refused by the registry"
        if isinstance(each, socket.gaierror):
            return "the registry's host name did not resolve"
        if isinstance(each, ssl.SSLError):
            return "TLS failure talking to the registry"
        if isinstance(each, TimeoutError):
            return REGISTRY_TIMED_OUT
        if isinstance(each, OSError) and each.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "the registry is unreachable"
    return "the connection to the registry broke off"


def _reason(exc: BaseException) -> BaseException | None:
    """urllib3 and requests keep the cause in `reason` or in their first argument."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        return reason
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, BaseException) else None


def _read_capped(r: requests.Response, limit: int, deadline: float, ref: Reference) -> bytes:
    """At most `limit` bytes of a response body, each read returning what has arrived, so
    that a registry dripping bytes meets the deadline rather than holds the scan."""
    out = bytearray()
    while len(out) < limit:
        chunk = r.raw.read1(min(CHUNK, limit - len(out)), decode_content=True)
        if not chunk:
            break
        out += chunk
        if time.monotonic() > deadline:
            raise RegistryError(f"{ref}: {ref.api_host} too slow: the deadline passed")
    return bytes(out)


class _BlobStream:
    """A file-like view of a blob response: read to its declared size + 1 at most, hashed
    as it goes, checked at the end, and copied into the cache when whole and verified."""

    def __init__(
        self,
        response: requests.Response,
        client: RegistryClient,
        digest: str,
        size: int,
        tee: IO[bytes] | None,
    ) -> None:
        self.response = response
        self.client = client
        self.digest = digest
        self.size = size
        self.tee = tee
        self.hash = hashlib.new(digest.split(":", 1)[0])
        self.got = 0
        self.buffer = bytearray()
        self.done = False
        self.deadline = time.monotonic() + client.limits.max_image_seconds

    def read(self, size: int = -1) -> bytes:
        limit = self.size + 1 if size < 0 else size
        while not self.done and len(self.buffer) < limit:
            self._pull()
        data = bytes(self.buffer[:limit])
        del self.buffer[:limit]
        return data

    def _pull(self) -> None:
        ask = min(CHUNK, self.size + 1 - self.got)
        with self.client.translating(f"blob {self.digest[:19]}"):
            chunk = self.response.raw.read1(ask, decode_content=True)
        if not chunk:
            self._finish()
            return
        self.got += len(chunk)
        self.client.stats.fetched += len(chunk)
        if time.monotonic() > self.deadline:
            raise RegistryError(f"{self.client.ref}: blob {self.digest[:19]}: deadline passed")
        if self.got > self.size:
            raise RegistryError(
                f"{self.client.ref}: blob {self.digest[:19]} is larger than the"
                f" {self.size} bytes its descriptor declares"
            )
        self.hash.update(chunk)
        if self.tee is not None:
            self.tee.write(chunk)
        self.buffer += chunk

    def _finish(self) -> None:
        self.done = True
        what = f"{self.client.ref}: blob {self.digest[:19]}"
        if self.got != self.size:
            raise RegistryError(f"{what}: ended after {self.got} of its {self.size} bytes")
        if self.hash.hexdigest() != self.digest.split(":", 1)[1]:
            raise RegistryError(f"{what}: content does not match its digest {self.digest}")
        if self.tee is not None and self.client.cache is not None:
            self.client.cache.commit(self.tee, self.digest)
            self.tee = None

    def close(self) -> None:
        self.response.close()
        if self.tee is not None:  # incomplete: never cached
            self.tee.close()
            os.unlink(self.tee.name)
            self.tee = None

    def __enter__(self) -> _BlobStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- images ---------------------------------------------------------------------------------


@dataclass
class RegistryImages:
    ref: Reference
    digest: str  # of the manifest or index the reference names
    images: list[ImageSource]
    client: RegistryClient

    def annotate(self, results: list[ImageResult]) -> None:
        """Say which digest was scanned and what the scan cost against the image's size."""
        stats = self.client.stats
        size = sum(stats.layer_bytes.values())
        for result in results:
            result.notes.append(f"{self.ref} is {self.digest}")
        if results:
            results[-1].notes.append(
                f"registry: fetched {_human(stats.fetched)} over the network and"
                f" {_human(stats.cached)} from the cache; the image's distinct layers:"
                f" {_human(size)} compressed"
            )


def registry_images(target: str, options: RegistryOptions, limits: Limits) -> RegistryImages:
    """Every image manifest the reference names (all platforms of an index)."""
    client, images, digest = resolve_images(target, options, limits)
    return RegistryImages(client.ref, digest, images, client)


def resolve_images(
    target: str,
    options: RegistryOptions,
    limits: Limits,
    platforms: Collection[Platform] | None = None,
) -> tuple[RegistryClient, list[ImageSource], str]:
    """`resolve` then `images_of`, as one resolution: under `options.deadline`, and within
    `limits.max_resolution_bytes` of manifests and configs."""
    client = RegistryClient(Reference.parse(target), options, limits)
    with client.resolution():
        top, digest = client.top()
        return client, images_of(client, top, digest, platforms), digest


def resolve(
    target: str, options: RegistryOptions, limits: Limits
) -> tuple[RegistryClient, dict[str, Any], str]:
    """The top manifest or index the reference names, and its digest (one small request;
    with `options.reuse`, a HEAD, and a GET by digest only for a digest not seen before)."""
    ref = Reference.parse(target)
    client = RegistryClient(ref, options, limits)
    top, digest = client.top()
    return client, top, digest


def images_of(
    client: RegistryClient,
    top: dict[str, Any],
    digest: str,
    platforms: Collection[Platform] | None = None,
) -> list[ImageSource]:
    """Manifests and configs of every platform, or of the first manifest of an index that
    declares each of `platforms` (scan.oci.walk); layers are opened only when scanned."""
    return walk(RegistryBlobs(client), top, digest, client.limits, platforms)


@dataclass(frozen=True)
class RegistryBlobs:
    """One repository's blobs as the OCI walk reads them (scan.oci.BlobStore)."""

    client: RegistryClient

    @property
    def label(self) -> str:
        return str(self.client.ref)

    def manifest(self, digest: str) -> dict[str, Any]:
        return self.client.manifest(digest)[0]

    def config(self, digest: str, size: int) -> Any:
        return self.client.json_blob(digest, size)

    def opener(self, digest: str, size: int) -> Callable[[], IO[bytes]]:
        self.client.stats.layer_bytes[digest] = size
        return lambda: self.client.open_blob(digest, size)

    def image_label(self, digest: str, ref_name: str | None) -> str:
        ref = self.client.ref
        return f"{ref.registry}/{ref.repository}@{digest}"


def _human(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} B"
