"""What a long-lived process (the placement controller) keeps between registry requests.

- `ContentMemo`: manifests and JSON blobs by registry, repository and digest, as verified
  when fetched (scan.registry makes the key). Content is addressed by its digest, so an
  entry never goes stale; it is bounded in entries and bytes and the least recently used
  goes first. A tag is never kept: it may move. A digest is never taken as content from
  another registry or repository: one that answers a HEAD with someone else's digest has
  to serve the bytes itself.
- `AuthCache`: the Authorization header that worked, per registry host, repository and
  credential (a keyed hash of user and password, never the password itself). A bearer
  token is kept until its `expires_in` less a margin; a header obtained with one
  credential is only ever sent with that same credential.
- `SessionPool`: one `requests.Session` per registry host and credential, least recently
  used closed first, each keeping at most `connections` idle connections per host, and
  accepting no cookies: a cookie set for one pod's credential is never sent for another's.

A forked child (the scan's process, `scan.isolated`) shares its parent's sockets and may
have been forked while another thread held one of these locks: it uses none of them
(`here()`), and opens its own connections.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cachetools import LRUCache, TLRUCache

if TYPE_CHECKING:
    import requests

MEMO_ENTRIES = 4096
MEMO_BYTES = 32 << 20
AUTH_ENTRIES = 4096
SESSIONS = 32
CONNECTIONS = 8  # idle connections kept per session and host: the controller's workers
TOKEN_DEFAULT_TTL = 60.0  # the distribution spec's default when `expires_in` is absent
TOKEN_MARGIN = 10.0  # seconds before its expiry a token is no longer sent
BASIC_TTL = 300.0  # how long "this registry takes basic auth" is remembered


@dataclass(frozen=True)
class Content:
    raw: bytes
    media_type: str  # the Content-Type it was served with ('' for a blob)


@dataclass
class ContentMemo:
    """Verified manifests and JSON blobs by key (registry, repository and digest);
    bounded in entries and bytes."""

    max_entries: int = MEMO_ENTRIES
    max_bytes: int = MEMO_BYTES
    _items: LRUCache[str, Content] = field(init=False)  # weighed by bytes
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._items = LRUCache(self.max_bytes, getsizeof=lambda content: len(content.raw))

    def get(self, key: str) -> Content | None:
        with self._lock:
            return self._items.get(key)  # a hit: now the newest

    def put(self, key: str, content: Content) -> None:
        """Keep `content`, which the caller has checked against the digest in `key`."""
        if len(content.raw) > self.max_bytes // 8:  # one entry never empties the memo
            return
        with self._lock:
            self._items[key] = content  # the least recently used out past max_bytes
            while len(self._items) > self.max_entries:
                self._items.popitem()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return int(self._items.currsize)


AuthKey = tuple[str, str, str]  # registry host, repository, credential key


@dataclass
class AuthCache:
    """Authorization headers by (host, repository, credential), each until its expiry."""

    max_entries: int = AUTH_ENTRIES
    clock: Callable[[], float] = time.monotonic
    _items: TLRUCache[AuthKey, tuple[str, float]] = field(init=False)  # (header, its ttl)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._items = TLRUCache(
            self.max_entries, lambda _key, found, now: now + found[1], timer=self.clock
        )

    def get(self, key: AuthKey) -> str | None:
        with self._lock:
            found = self._items.get(key)  # a hit not expired: now the newest
            return found[0] if found is not None else None

    def put(self, key: AuthKey, header: str, ttl: float) -> None:
        if ttl <= 0:
            return
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = (header, ttl)

    def forget(self, key: AuthKey) -> None:
        with self._lock:
            self._items.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            self._items.expire()
            return len(self._items)


def token_ttl(expires_in: object) -> float:
    """Seconds a token may be sent again: its `expires_in` (the spec's 60 s when absent or
    not a number) less a margin, so that a slow request does not carry an expired token."""
    valid = isinstance(expires_in, int | float) and not isinstance(expires_in, bool)
    seconds = float(expires_in) if valid else TOKEN_DEFAULT_TTL  # type: ignore[arg-type]
    return min(seconds, 3600.0) - TOKEN_MARGIN


def new_session(connections: int) -> requests.Session:
    """A Session that keeps `connections` idle connections per host and no cookies, whose
    connections obey the egress and deadline of the request that uses them (scan.guard)."""
    import requests

    from execwatch.scan.egress import Watch
    from execwatch.scan.guard import GuardedAdapter, NoCookies

    session = requests.Session()
    session.cookies.set_policy(NoCookies())
    adapter = GuardedAdapter(Watch(), connections)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


SessionKey = tuple[str, str]  # registry host, credential key


@dataclass
class SessionPool:
    """One Session per (registry host, credential); past `max_sessions`, the least recently
    used is closed. Closing is safe under a request in flight: urllib3 closes a connection
    returned to a closed pool, and a later request opens a new one."""

    max_sessions: int = SESSIONS
    connections: int = CONNECTIONS
    _items: LRUCache[SessionKey, requests.Session] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._items = LRUCache(max(1, self.max_sessions))

    def get(self, key: SessionKey) -> requests.Session:
        with self._lock:
            found = self._items.get(key)  # a hit: now the newest
            if found is not None:
                return found
            evicted = []  # closed out of the lock, never dropped unclosed by the cache
            while len(self._items) >= self._items.maxsize:
                evicted.append(self._items.popitem()[1])
            made = self._items[key] = new_session(self.connections)
        for session in evicted:
            session.close()
        return made

    def close(self) -> None:
        with self._lock:
            sessions = list(self._items.values())
            self._items.clear()
        for session in sessions:
            session.close()

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class RegistryReuse:
    """The memo, the auth cache and the sessions of one process, shared by its threads."""

    memo: ContentMemo = field(default_factory=ContentMemo)
    auth: AuthCache = field(default_factory=AuthCache)
    sessions: SessionPool = field(default_factory=SessionPool)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _pid: int = field(default_factory=os.getpid)

    def here(self) -> RegistryReuse | None:
        """This, in the process that made it; None in a forked child."""
        return self if os.getpid() == self._pid else None

    def credential_key(self, username: str | None, password: str | None) -> str:
        """Who asks: '' when anonymous, else a keyed hash of user and password, so that
        the same secret in two namespaces is one credential and nothing reveals it."""
        if username is None or password is None:
            return ""
        text = f"{username}\0{password}".encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()

    def close(self) -> None:
        self.sessions.close()
