"""The Kubernetes API's error taxonomy, in one place (as kopf's `errors.py`).

Every API call goes through the one client (`kube.client.Rest`), which turns an answer
with an error status into one of five kinds (`from_status`) and anything httpx2 raises
into "no answer" (`translate`), so the callers decide by kind, never by status:

- `RetryableError`: no answer (status 0: timeouts, resets), 429, 5xx, 401, a 403 from a
  ResourceQuota, and the 409 the quota admission answers when it lost a race for the
  ResourceQuota object ("Operation cannot be fulfilled on resourcequotas": nothing was
  created). Retry later, after `retry_after` if the server gave one.
- `PermanentError`: 400, 403, 405, 413, 415, 422 and any other 4xx. The request itself is
  refused and will be again: never retry it.
- `ConflictError`: 409 (AlreadyExists, or a precondition / resourceVersion mismatch).
- `NotFoundError`: 404, the object is gone.
- `ExpiredError`: 410, a watch or list resourceVersion too old: list again.

`may_have_acted` says whether the server may have carried the request out although the
caller got an error (no answer, 500, 504): the write must be retried idempotently, or its
effect checked, never assumed undone.

403 is permanent (RBAC or an admission webhook said no, and will say it again) except a
ResourceQuota's refusals: "exceeded quota" lifts when objects are deleted, and "status
unknown for quota" when the controller-manager first counts the quota's resources. A quota
on a custom resource whose CRD is new (the chart's `count/execfailures.execwatch.io`, right
after install) stays uncounted until the quota controller's next full resync, 5 minutes by
default, and every create is refused that way until then. 401 is retryable: a rotated
ServiceAccount token is re-read by the client on the next call.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

RETRY_AFTER_CAP = 300.0  # seconds; a hostile or broken proxy cannot park us longer


class ApiError(Exception):
    """A failed API call. `status` is the HTTP status, 0 if there was no answer."""

    def __init__(
        self, status: int, reason: str = "", message: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def may_have_acted(self) -> bool:
        """The server may have done what was asked although the call failed."""
        return self.status in (0, 500, 504)


class RetryableError(ApiError):
    """Try again later (after `retry_after` seconds if the server gave them)."""


class PermanentError(ApiError):
    """The request is refused and will be refused again: never retry it."""


class ConflictError(ApiError):
    """409: the object already exists, or a precondition / resourceVersion did not match."""


class NotFoundError(ApiError):
    """404: the object does not exist (any more)."""


class ExpiredError(ApiError):
    """410: the resourceVersion asked for is too old; list again."""


def from_status(
    status: int,
    reason: str = "",
    message: str = "",
    headers: Mapping[str, str] | None = None,
) -> ApiError:
    """The error for an HTTP answer (`status` 0: no answer)."""
    retry_after = parse_retry_after((headers or {}).get("Retry-After"))
    kind: type[ApiError]
    if status == 404:
        kind = NotFoundError
    elif status == 409 and not _quota_conflict(message):
        kind = ConflictError
    elif status == 410:
        kind = ExpiredError
    elif status in (0, 401, 408, 409, 429) or status >= 500 or _quota(status, message):
        kind = RetryableError
    else:
        kind = PermanentError
    return kind(status, reason, message, retry_after)


def _quota_conflict(message: str) -> bool:
    """The quota admission lost a race for the ResourceQuota object (the quota controller
    or another create updated it first): nothing was created, and a retry succeeds."""
    return message.startswith("Operation cannot be fulfilled on resourcequotas")


def _quota(status: int, message: str) -> bool:
    return status == 403 and ("exceeded quota" in message or "status unknown for quota" in message)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(RETRY_AFTER_CAP, max(0.0, seconds))


def status_message(body: bytes | str | None) -> tuple[str, str]:
    """(reason, message) of a metav1.Status body; empty strings if it is not one."""
    if not body:
        return "", ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    return str(data.get("reason") or ""), str(data.get("message") or "")[:1024]


# Exceptions that mean "no answer": the request may or may not have reached the server.
_NO_ANSWER: tuple[type[BaseException], ...] = (OSError,)  # resets, timeouts, ssl.SSLError


def classify(exc: BaseException) -> ApiError:
    """Whatever a client call raised, as one of the kinds above."""
    if isinstance(exc, ApiError):
        return exc
    answer: Any = getattr(exc, "response", None)  # httpx2.HTTPStatusError
    if isinstance(getattr(answer, "status_code", None), int) and answer.status_code > 0:
        return _answered(answer)
    if isinstance(exc, _NO_ANSWER) or _is_transport_error(exc):
        return RetryableError(0, type(exc).__name__, str(exc)[:256])
    raise exc


def _answered(answer: Any) -> ApiError:
    """An httpx2 response with an error status: a Status body, or a bare text (429)."""
    try:
        body = answer.content
    except Exception:  # a streamed answer that was not read
        body = b""
    reason, message = status_message(body)
    text = message or body[:1024].decode("utf-8", "replace")
    return from_status(answer.status_code, reason or answer.reason_phrase, text, answer.headers)


def _is_transport_error(exc: BaseException) -> bool:
    """No answer, as httpx2 says it (timeouts, resets, a torn stream)."""
    import httpx2

    return isinstance(exc, httpx2.TransportError | httpx2.StreamError)


def timed_out(err: BaseException) -> bool:
    """No answer within the client's timeout (connect, TLS handshake, read): `err` or, for
    an `ApiError` that `translate` made, what it was made from."""
    import httpx2

    cause = err.__cause__ if isinstance(err, ApiError) else err
    return isinstance(cause, httpx2.TimeoutException | TimeoutError)


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """Re-raise what an API call raises as an `ApiError` of the right kind.

    Programming errors (TypeError, KeyError, ...) pass through unchanged."""
    try:
        yield
    except ApiError:
        raise
    except Exception as exc:
        raise classify(exc) from exc


def delay(err: ApiError, fallback: float) -> float:
    """How long to wait before retrying after `err`: the server's word, else ours."""
    return max(fallback, err.retry_after) if err.retry_after is not None else fallback


def code(err: BaseException) -> str:
    """The status as a metric label value ("0": no answer, "error": not an API error)."""
    return str(err.status) if isinstance(err, ApiError) else "error"


def as_dict(err: ApiError) -> dict[str, Any]:
    """For structured logs."""
    return {"status": err.status, "kind": type(err).__name__, "reason": err.reason}
