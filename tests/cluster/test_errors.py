"""The API error taxonomy: what each answer (or its absence) means for the caller."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from execwatch.cluster import errors


def api_exception(
    status: int, message: str = "", headers: dict[str, str] | None = None
) -> Exception:
    exc = ApiException(status=status, reason="R")
    exc.body = json.dumps({"kind": "Status", "reason": "Because", "message": message}).encode()
    exc.headers = headers or {}
    result: Exception = exc
    return result


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, errors.PermanentError),
        (403, errors.PermanentError),
        (405, errors.PermanentError),
        (413, errors.PermanentError),
        (422, errors.PermanentError),
        (404, errors.NotFoundError),
        (409, errors.ConflictError),
        (410, errors.ExpiredError),
        (401, errors.RetryableError),
        (429, errors.RetryableError),
        (500, errors.RetryableError),
        (503, errors.RetryableError),
        (504, errors.RetryableError),
    ],
)
def test_each_status_has_one_kind(status: int, kind: type[errors.ApiError]) -> None:
    err = errors.classify(api_exception(status))
    assert type(err) is kind and err.status == status and err.reason == "Because"


def test_a_quota_refusal_is_retryable_other_403s_are_not() -> None:
    quota = errors.classify(
        api_exception(403, "exceeded quota: execwatch-records, requested: count/x=1")
    )
    assert isinstance(quota, errors.RetryableError)
    # A quota the controller-manager has not counted yet (a new CRD's): it will be.
    uncounted = errors.classify(
        api_exception(
            403,
            'execfailures.execwatch.io "x" is forbidden: status unknown for quota: '
            "execwatch-records, resources: count/execfailures.execwatch.io",
        )
    )
    assert isinstance(uncounted, errors.RetryableError)
    assert isinstance(errors.classify(api_exception(403, "cannot patch")), errors.PermanentError)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(),
        OSError("No route to host"),
        TimeoutError(),
        ProtocolError("Connection aborted.", ConnectionResetError()),
        ReadTimeoutError(None, "/x", "read timed out"),  # type: ignore[arg-type]
    ],
)
def test_no_answer_is_retryable_and_may_have_acted(exc: Exception) -> None:
    err = errors.classify(exc)
    assert isinstance(err, errors.RetryableError) and err.status == 0 and err.may_have_acted


def test_only_no_answer_and_server_timeouts_may_have_acted() -> None:
    acted = {
        s for s in (0, 400, 404, 409, 429, 500, 503, 504) if errors.from_status(s).may_have_acted
    }
    assert acted == {0, 500, 504}


def test_retry_after_is_honoured_and_capped() -> None:
    err = errors.classify(api_exception(429, headers={"Retry-After": "7"}))
    assert err.retry_after == 7.0 and errors.delay(err, 0.5) == 7.0
    assert errors.delay(err, 9.0) == 9.0
    assert errors.delay(errors.from_status(503), 0.5) == 0.5
    assert errors.parse_retry_after("99999") == errors.RETRY_AFTER_CAP
    assert errors.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert errors.parse_retry_after("soon") is None


def test_translate_turns_client_errors_into_kinds_and_lets_bugs_through() -> None:
    with pytest.raises(errors.NotFoundError), errors.translate():
        raise api_exception(404)
    with pytest.raises(KeyError), errors.translate():
        raise KeyError("a bug is not an API error")


def test_a_non_status_body_still_classifies() -> None:
    exc = ApiException(status=502, reason="Bad Gateway")
    exc.body = b"<html>proxy</html>"
    err = errors.classify(exc)
    assert isinstance(err, errors.RetryableError) and err.reason == "Bad Gateway"
