"""The API error taxonomy: what each answer (or its absence) means for the caller, as the
one client (`kube.client.Rest`, on httpx2) meets it."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from execwatch.kube import errors


def httpx_answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
    request = httpx2.Request("DELETE", "https://api.test/apis/x")
    return httpx2.Response(status, content=body, headers=headers, request=request)


def api_exception(
    status: int, message: str = "", headers: dict[str, str] | None = None
) -> Exception:
    """An answer with an error status and a Status body, as httpx2 raises it."""
    body = json.dumps({"kind": "Status", "reason": "Because", "message": message}).encode()
    answer = httpx_answer(status, body, headers)
    return httpx2.HTTPStatusError(str(status), request=answer.request, response=answer)


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


def test_the_quota_admissions_lost_race_is_retryable_other_409s_are_conflicts() -> None:
    lost_race = errors.from_status(
        409,
        "Conflict",
        'Operation cannot be fulfilled on resourcequotas "execwatch-records": the object '
        "has been modified; please apply your changes to the latest version and try again",
    )
    assert isinstance(lost_race, errors.RetryableError) and not lost_race.may_have_acted
    precondition = errors.from_status(409, "Conflict", "Precondition failed: UID in precondition")
    assert isinstance(precondition, errors.ConflictError)
    assert isinstance(errors.from_status(409, "AlreadyExists", "x exists"), errors.ConflictError)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(),
        OSError("No route to host"),
        TimeoutError(),
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
    answer = httpx_answer(502, b"<html>proxy</html>")
    err = errors.classify(httpx2.HTTPStatusError("502", request=answer.request, response=answer))
    assert isinstance(err, errors.RetryableError) and err.reason == "Bad Gateway"


@pytest.mark.parametrize(
    "exc",
    [
        httpx2.ConnectError("connection refused"),
        httpx2.ReadTimeout("timed out"),
        httpx2.RemoteProtocolError("server disconnected without sending a response"),
        httpx2.ReadError("reset by peer"),
    ],
)
def test_no_answer_on_the_httpx2_transport_is_retryable_and_may_have_acted(
    exc: Exception,
) -> None:
    err = errors.classify(exc)
    assert isinstance(err, errors.RetryableError) and err.status == 0 and err.may_have_acted


def test_an_error_answer_classifies_by_its_status_body() -> None:
    body = json.dumps({"kind": "Status", "reason": "NotFound", "message": "gone"}).encode()
    answer = httpx_answer(404, body)
    with pytest.raises(errors.NotFoundError) as err, errors.translate():
        raise httpx2.HTTPStatusError("404", request=answer.request, response=answer)
    assert (err.value.status, err.value.reason, err.value.message) == (404, "NotFound", "gone")


def test_an_apf_429_without_a_status_body_is_retryable_after_its_header() -> None:
    answer = httpx_answer(429, b"Too many requests, please try again later.\n",
                          {"Retry-After": "3", "Content-Type": "text/plain"})  # fmt: skip
    exc = httpx2.HTTPStatusError("429", request=answer.request, response=answer)
    err = errors.classify(exc)
    assert isinstance(err, errors.RetryableError) and err.retry_after == 3.0
    assert err.reason == "Too Many Requests" and err.message.startswith("Too many requests")


def test_a_timeout_is_told_apart_from_other_silences() -> None:
    with pytest.raises(errors.RetryableError) as timeout, errors.translate():
        raise httpx2.ConnectTimeout("_ssl.c:989: The handshake operation timed out")
    with pytest.raises(errors.RetryableError) as refused, errors.translate():
        raise httpx2.ConnectError("connection refused")
    assert errors.timed_out(timeout.value) and not errors.timed_out(refused.value)
    assert errors.timed_out(TimeoutError()) and not errors.timed_out(errors.from_status(503))
