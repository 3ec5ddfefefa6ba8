"""HttpGateway against httpx.MockTransport (the docs/gateway.md contract and failure table), and
against loopback servers through httpx's own transport."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import re
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest

from domain.ports import (
    AmbiguousCreate,
    FamilyMember,
    Gateway,
    GatewayError,
    MalformedAnswer,
    RequestRejected,
    TransientGatewayError,
    Unauthorized,
    WorkspaceGone,
)
from infrastructure.gateway import adapter as gateway_module
from infrastructure.gateway import answers as gateway_answers
from infrastructure.gateway.adapter import HttpGateway

TOKEN = "tok-SECRET-5f3a9c"  # a fake token whose leaks we hunt for
BASE = "http://gateway.test/api"
PARENT = "parent-1"

Handler = Callable[[httpx.Request], httpx.Response]
Answer = httpx.Response | Exception | Handler


class Recorder:
    """A MockTransport handler that plays scripted answers and records requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    @property
    def count(self) -> int:
        return len(self.requests)


Make = Callable[..., tuple[HttpGateway, Recorder]]


@pytest.fixture
def make() -> Iterator[Make]:
    made: list[HttpGateway] = []

    def build(*answers: Answer, retries: int = 2) -> tuple[HttpGateway, Recorder]:
        recorder = Recorder(*answers)
        gateway = HttpGateway(
            BASE,
            TOKEN,
            retries=retries,
            retry_backoff_s=0,
            transport=httpx.MockTransport(recorder),
        )
        gateway._sleep = lambda _s: None  # a Retry-After must not slow the tests
        made.append(gateway)
        return gateway, recorder

    yield build
    for gateway in made:
        gateway.close()


def ok(body: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def status_only(code: int, text: str = "") -> httpx.Response:
    return httpx.Response(code, text=text)


def is_a_gateway(gateway: Gateway) -> None:
    """Static check (mypy) that HttpGateway satisfies the port."""


# -- the happy paths, requests as the contract says -----------------------------------


def test_satisfies_the_port(make: Make) -> None:
    gateway, _ = make(ok({}))
    is_a_gateway(gateway)


def test_create_child_posts_title_and_returns_id(make: Make) -> None:
    gateway, rec = make(ok({"id": "ws-9", "status": "not ready"}))
    assert gateway.create_child(PARENT, "Brand A") == "ws-9"
    (request,) = rec.requests
    assert request.method == "POST"
    assert request.url.raw_path == b"/api/v2/workspaces/parent-1/child"
    assert json.loads(request.content) == {"title": "Brand A", "resources": {}}
    assert request.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"id": 42}, "42"), ({"status": "not ready"}, ""), ({"id": None}, ""), ({"id": ""}, "")],
)
def test_create_child_returns_the_id_as_given_for_the_domain_to_judge(
    make: Make, body: object, expected: str
) -> None:
    gateway, _ = make(ok(body))
    assert gateway.create_child(PARENT, "T") == expected


def test_create_child_returns_the_parent_id_unjudged(make: Make) -> None:
    gateway, _ = make(ok({"id": PARENT}))
    assert gateway.create_child(PARENT, "T") == PARENT


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>oops</html>"),
        ok(["ws-1"]),
        ok("ws-1"),
        ok({"id": {"nested": 1}}),
        ok({"id": True}),
    ],
)
def test_create_child_malformed_answer(make: Make, answer: httpx.Response) -> None:
    gateway, _ = make(answer)
    with pytest.raises(MalformedAnswer):
        gateway.create_child(PARENT, "T")


def test_bearer_token_and_timeouts_are_sent(make: Make) -> None:
    gateway, rec = make(ok({"status": "created"}))
    gateway.status("ws-1")
    (request,) = rec.requests
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.headers["accept"] == "application/json"
    assert request.extensions["timeout"] == {
        "connect": 3.0,
        "read": 10.0,
        "write": 10.0,
        "pool": 10.0,
    }


def test_explicit_timeouts_are_used() -> None:
    rec = Recorder(ok({"status": "x"}))
    with HttpGateway(
        BASE,
        TOKEN,
        connect_timeout=0.5,
        read_timeout=2.0,
        transport=httpx.MockTransport(rec),
    ) as gateway:
        gateway.status("ws-1")
    assert rec.requests[0].extensions["timeout"]["connect"] == 0.5
    assert rec.requests[0].extensions["timeout"]["read"] == 2.0


def test_status_returns_the_raw_string(make: Make) -> None:
    gateway, rec = make(ok({"status": "  Not Ready "}))
    assert gateway.status("ws-1") == "  Not Ready "
    assert rec.requests[0].method == "GET"
    assert rec.requests[0].url.raw_path == b"/api/v1/workspaces/ws-1/status"


def test_status_missing_is_empty(make: Make) -> None:
    gateway, _ = make(ok({}))
    assert gateway.status("ws-1") == ""


@pytest.mark.parametrize("answer", [ok(["created"]), httpx.Response(200, text="created")])
def test_status_malformed(make: Make, answer: httpx.Response) -> None:
    gateway, _ = make(answer)
    with pytest.raises(MalformedAnswer):
        gateway.status("ws-1")


def test_a_status_carrying_the_token_is_scrubbed(make: Make) -> None:
    gateway, _ = make(ok({"status": f"not ready ({TOKEN})"}))
    assert gateway.status("ws-1") == "not ready ([redacted])"


def test_family_statuses_and_titles_carrying_the_token_are_scrubbed(make: Make) -> None:
    gateway, _ = make(ok([{"id": "ws-2", "title": f"T {TOKEN}", "status": f"x{TOKEN}"}]))
    (member,) = gateway.family(PARENT)
    assert TOKEN not in repr(member)
    assert member.status == "x[redacted]"


@pytest.mark.parametrize(
    ("op", "answer"),
    [
        ("create", ok({"id": f"ws-{TOKEN}"}, 201)),
        ("family", ok([{"id": f"ws-{TOKEN}", "title": "T", "status": "created"}])),
        ("projects", ok({"items": [{"id": f"p-{TOKEN}"}]})),
    ],
)
def test_an_id_carrying_the_token_is_refused_not_stored(
    make: Make, op: str, answer: httpx.Response
) -> None:
    gateway, _ = make(answer)
    calls = {
        "create": lambda: gateway.create_child(PARENT, "T"),
        "family": lambda: gateway.family(PARENT),
        "projects": lambda: gateway.list_projects("ws-1"),
    }
    with pytest.raises(MalformedAnswer, match="credentials") as caught:
        calls[op]()
    assert TOKEN not in str(caught.value)


def test_family_parses_a_bare_array_including_the_parent(make: Make) -> None:
    gateway, rec = make(
        ok(
            [
                {"id": PARENT, "title": "Parent", "status": "active"},
                {"id": "ws-2", "title": "Brand A", "status": "not ready"},
                {"title": "no id, skipped", "status": "created"},
                {"id": None, "title": "null id, skipped"},
                {"id": 7},
            ]
        )
    )
    assert gateway.family(PARENT) == [
        FamilyMember(id=PARENT, title="Parent", status="active"),
        FamilyMember(id="ws-2", title="Brand A", status="not ready"),
        FamilyMember(id="7", title="", status=""),
    ]
    assert rec.requests[0].url.raw_path == b"/api/v1/workspaces/parent-1/family"


def test_family_by_title_decodes_only_that_title(make: Make) -> None:
    gateway, _ = make(
        ok(
            [
                {"id": PARENT, "title": "Brand A", "status": "active"},
                {"id": "ws-2", "title": "Brand A", "status": "not ready"},
                {"id": "ws-3", "title": "brand a", "status": "created"},
                {"id": ["odd"], "title": "Another brand", "status": 3.5},
            ]
        )
    )
    # Exact titles only; an entry of another title is not judged, even a malformed one.
    assert gateway.family(PARENT, "Brand A") == [
        FamilyMember(id=PARENT, title="Brand A", status="active"),
        FamilyMember(id="ws-2", title="Brand A", status="not ready"),
    ]


def test_family_by_title_still_refuses_a_listing_that_is_not_objects(make: Make) -> None:
    gateway, _ = make(ok([{"id": "ws-2", "title": "Brand A"}, "not an object"]))
    with pytest.raises(MalformedAnswer):
        gateway.family(PARENT, "Brand A")


@pytest.mark.parametrize(
    "answer",
    [ok({"items": []}), ok({"family": []}), ok(["not an object"]), status_only(200, "[")],
)
def test_family_that_is_not_a_bare_array_of_objects_is_malformed(
    make: Make, answer: httpx.Response
) -> None:
    gateway, _ = make(answer)
    with pytest.raises(MalformedAnswer):
        gateway.family(PARENT)


def test_list_projects_requires_type_ai(make: Make) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("type") != "ai":
            return ok({"error": "type is required"}, 400)
        return ok({"items": [{"id": "p1"}, {"id": 2}]})

    gateway, rec = make(handler)
    assert gateway.list_projects("ws-1") == ["p1", "2"]
    assert rec.requests[0].url.path == "/api/v1/workspaces/ws-1/projects"
    assert dict(rec.requests[0].url.params) == {"type": "ai"}


def test_list_projects_empty(make: Make) -> None:
    gateway, _ = make(ok({"items": []}))
    assert gateway.list_projects("ws-1") == []


@pytest.mark.parametrize(
    "answer",
    [
        ok({}),
        ok({"items": None}),
        ok([{"id": "p1"}]),
        ok({"items": [{"name": "no id"}]}),
        ok({"items": ["p1"]}),
    ],
)
def test_list_projects_never_under_reports(make: Make, answer: httpx.Response) -> None:
    gateway, _ = make(answer)
    with pytest.raises(MalformedAnswer):
        gateway.list_projects("ws-1")


@pytest.mark.parametrize("code", [200, 202, 204, 404])
def test_delete_project_2xx_or_404_is_success(make: Make, code: int) -> None:
    gateway, rec = make(status_only(code))
    gateway.delete_project("ws-1", "p1")  # no exception: success
    assert rec.count == 1
    assert rec.requests[0].method == "DELETE"
    assert rec.requests[0].url.raw_path == b"/api/v1/workspaces/ws-1/projects/p1"


def test_path_segments_are_url_encoded(make: Make) -> None:
    gateway, rec = make(ok({"status": "created"}), status_only(204))
    gateway.status("a/b c?#é")
    gateway.delete_project("..", ".")
    assert rec.requests[0].url.raw_path == b"/api/v1/workspaces/a%2Fb%20c%3F%23%C3%A9/status"
    assert rec.requests[1].url.raw_path == b"/api/v1/workspaces/%2E%2E/projects/%2E"


def test_empty_id_is_refused_without_a_call(make: Make) -> None:
    gateway, rec = make(ok({}))
    with pytest.raises(RequestRejected):
        gateway.status("")
    with pytest.raises(RequestRejected):
        gateway.create_child("", "T")
    assert rec.count == 0


# -- what an answer may hold: ids, sizes, codings, nesting ----------------------------

LONGEST_ID = "w" * 128


@pytest.mark.parametrize(
    "bad_id",
    [
        "w" * 129,
        "w" * 65536,
        "ws 1",
        "ws/1",
        "ws\x1b[31m",
        "ws\x07",
        "ws\n1",
        "wé",
        "ws:1",
        10**200,
    ],
)
def test_an_id_outside_the_gateway_id_pattern_is_malformed(make: Make, bad_id: object) -> None:
    gateway, _ = make(
        ok({"id": bad_id}),
        ok([{"id": bad_id, "title": "T", "status": "created"}]),
        ok({"items": [{"id": bad_id}]}),
    )
    for call in (
        lambda: gateway.create_child(PARENT, "T"),
        lambda: gateway.family(PARENT, "T"),
        lambda: gateway.list_projects("ws-1"),
    ):
        with pytest.raises(MalformedAnswer, match="not matching") as raised:
            call()
        assert "\x1b" not in str(raised.value)
        assert len(str(raised.value)) < 200  # the id is not quoted back


def test_ids_the_pattern_allows_are_taken(make: Make) -> None:
    gateway, _ = make(
        ok({"id": LONGEST_ID}),
        ok([{"id": "A-z_0.9", "title": "T", "status": "created"}]),
    )
    assert gateway.create_child(PARENT, "T") == LONGEST_ID
    assert [m.id for m in gateway.family(PARENT)] == ["A-z_0.9"]


def test_a_bad_id_under_another_title_is_not_read(make: Make) -> None:
    listing = [{"id": "ws\x1b", "title": "Other", "status": "x"}, {"id": "ws-1", "title": "T"}]
    gateway, _ = make(ok(listing))
    assert [m.id for m in gateway.family(PARENT, "T")] == ["ws-1"]


def test_a_create_answer_keeps_its_id_whatever_else_it_holds(make: Make) -> None:
    # Only the id is read: a malformed status or title cannot lose what was created.
    gateway, _ = make(ok({"id": "ws-9", "status": {"not": "a string"}, "title": [7], "x": None}))
    assert gateway.create_child(PARENT, "T") == "ws-9"


def test_a_created_id_is_on_record_though_the_rest_of_the_answers_is_malformed() -> None:
    from tests.support import ManualClock, new_service

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/family"):
            return ok([{"id": PARENT, "title": "parent", "status": "active"}])
        if path.endswith("/child"):
            return ok({"id": "ws-9", "status": 42}, status=201)
        return ok({"status": {"nested": "not a status"}})  # the first poll

    gateway = HttpGateway(BASE, TOKEN, retries=0, transport=httpx.MockTransport(answer))
    service = new_service(gateway, ManualClock())
    try:
        attempt_id = service.request_provisioning("b1", "Acme", PARENT)
        outcome = service.run_hop(attempt_id, 0)
    finally:
        gateway.close()
    attempt = service.attempt(attempt_id)
    assert attempt.candidate_id == "ws-9"
    assert "ws-9" in attempt.created_ids
    assert outcome.next_hop == 1  # the status was unreadable: polled again later
    events = [type(e).__name__ for e in service.attempt_history(attempt_id)]
    assert events[:3] == ["Started", "CreateRequested", "CandidateAccepted"]


def _sized(size: int) -> bytes:
    """A JSON status answer of exactly `size` bytes."""
    head, tail = b'{"status": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_answers_over_their_cap_are_malformed(make: Make) -> None:
    cap = gateway_module._ANSWER_MAX
    assert cap == 1024 * 1024
    member = b'{"id": "ws-1", "title": "T", "status": "' + b"s" * 1000 + b'"},'
    listing = b"[" + member * (2 * cap // len(member)) + member[:-1] + b"]"  # over 1 MiB
    gateway, rec = make(
        httpx.Response(200, content=_sized(cap)),
        httpx.Response(200, content=_sized(cap + 1)),
        httpx.Response(200, content=listing),
    )
    assert len(gateway.status("ws-1")) > cap - 20
    with pytest.raises(MalformedAnswer, match="larger than"):
        gateway.status("ws-1")
    # A listing's bound is its own (tests/unit/test_gateway_family.py).
    assert len(gateway.family(PARENT, "T")) > 1000
    assert rec.count == 3  # never retried


def _coded(coding: str, body: bytes, status: int = 200) -> httpx.Response:
    """An answer whose body is not read in advance by httpx (as from the network)."""
    return httpx.Response(
        status, headers={"Content-Encoding": coding}, stream=httpx.ByteStream(body)
    )


_BOMB = gzip.compress(b"0" * (64 * 1024 * 1024))  # 64 MiB of digits in about 64 KiB


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "gzip, gzip", "x-unknown"])
def test_a_compressed_answer_is_refused_unread(make: Make, coding: str) -> None:
    gateway, rec = make(_coded(coding, _BOMB), _coded(coding, _BOMB, 201))
    with pytest.raises(MalformedAnswer, match="compressed"):
        gateway.status("ws-1")
    with pytest.raises(AmbiguousCreate, match="compressed"):  # may have been made: recovered
        gateway.create_child(PARENT, "T")
    assert rec.requests[0].headers["accept-encoding"] == "identity"


def test_an_answer_coded_identity_or_with_no_body_is_read(make: Make) -> None:
    gateway, _ = make(_coded("identity", b'{"status": "created"}'), _coded("gzip", b"", 204))
    assert gateway.status("ws-1") == "created"
    gateway.delete_project("ws-1", "p-1")


@pytest.mark.parametrize(
    "content",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"id": ' * 50_000 + b'"x"' + b"}" * 50_000,
        b'{"status": "\xff\xfe"}',
        b'{"status": "created"',
        b'{"id": 1e999999, "status": 1e999999}',
        b'{"status": ' + b"9" * 5000 + b"}",
        b"\x00\x01\x02",
    ],
    ids=["deep-array", "deep-object", "not-utf8", "cut", "huge-float", "huge-int", "binary"],
)
def test_an_answer_that_does_not_decode_is_malformed(make: Make, content: bytes) -> None:
    gateway, _ = make(httpx.Response(200, content=content))
    for call in (
        lambda: gateway.status("ws-1"),
        lambda: gateway.family(PARENT),
        lambda: gateway.list_projects("ws-1"),
        lambda: gateway.create_child(PARENT, "T"),
    ):
        with pytest.raises(MalformedAnswer):
            call()


def test_a_rejection_nested_too_deeply_still_reads_as_a_rejection(make: Make) -> None:
    gateway, _ = make(httpx.Response(409, content=b"[" * 100_000))
    with pytest.raises(RequestRejected, match=r"HTTP 409: \[\[\["):
        gateway.create_child(PARENT, "T")


# -- create: never retried; the failure table -----------------------------------------


def _timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def _drop(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("Server disconnected without sending a response.")


def _read_error(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("connection reset by peer", request=request)


def _write_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.WriteTimeout("write timed out", request=request)


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def _connect_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectTimeout("connect timed out", request=request)


def _pool_timeout(request: httpx.Request) -> httpx.Response:
    raise httpx.PoolTimeout("no connection available", request=request)


def _bad_gzip(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_timeout, AmbiguousCreate),
        (_write_timeout, AmbiguousCreate),
        (_drop, AmbiguousCreate),
        (_read_error, AmbiguousCreate),
        (_bad_gzip, AmbiguousCreate),
        (status_only(500), AmbiguousCreate),
        (status_only(502), AmbiguousCreate),
        (status_only(503), AmbiguousCreate),
        (_refused, TransientGatewayError),
        (_connect_timeout, TransientGatewayError),
        (_pool_timeout, TransientGatewayError),
        (status_only(429), TransientGatewayError),
        (status_only(401), Unauthorized),
        (status_only(403), Unauthorized),
        (ok({"error": "conflict"}, 409), RequestRejected),
        (ok({"error": "insufficient available units"}, 422), RequestRejected),
        (status_only(400, "bad"), RequestRejected),
        (status_only(404, "no parent"), RequestRejected),
        (status_only(302), MalformedAnswer),
    ],
)
def test_create_failure_mapping_and_never_retried(
    make: Make, answer: httpx.Response | Handler, error: type[GatewayError]
) -> None:
    gateway, rec = make(answer, ok({"id": "ws-late"}), retries=5)
    with pytest.raises(error):
        gateway.create_child(PARENT, "T")
    assert rec.count == 1


@pytest.mark.parametrize(
    ("answer", "answered"),
    [
        (_timeout, False),  # the gateway may still hold the request
        (_drop, False),
        (status_only(502), False),  # a proxy's: the gateway behind it may still hold it
        (status_only(504), False),
        (status_only(500), True),  # the gateway's own answer: it is done with it
        (status_only(503), True),
        (_bad_gzip, True),
    ],
)
def test_an_ambiguous_create_says_whether_the_gateway_answered_it(
    make: Make, answer: httpx.Response | Handler, answered: bool
) -> None:
    gateway, _ = make(answer, retries=0)
    with pytest.raises(AmbiguousCreate) as raised:
        gateway.create_child(PARENT, "T")
    assert raised.value.answered is answered


def test_rejection_carries_the_gateways_text_truncated(make: Make) -> None:
    gateway, _ = make(ok({"error": "insufficient available units"}, 422))
    with pytest.raises(RequestRejected, match="422: insufficient available units"):
        gateway.create_child(PARENT, "T")

    long_text = "x" * 500 + " tail"
    gateway, _ = make(status_only(409, long_text))
    with pytest.raises(RequestRejected) as info:
        gateway.create_child(PARENT, "T")
    assert "x" * 200 in str(info.value)
    assert "x" * 201 not in str(info.value)
    assert "tail" not in str(info.value)


# -- GETs and DELETEs: retried, then transient ----------------------------------------


def _create(gateway: HttpGateway) -> object:
    return gateway.create_child(PARENT, "T")


READS: dict[str, Callable[[HttpGateway], object]] = {
    "status": lambda g: g.status("ws-1"),
    "family": lambda g: g.family(PARENT),
    "list_projects": lambda g: g.list_projects("ws-1"),
    "delete_project": lambda g: g.delete_project("ws-1", "p1"),
}
GOOD = {
    "status": ok({"status": "created"}),
    "family": ok([{"id": PARENT, "title": "P", "status": "active"}]),
    "list_projects": ok({"items": [{"id": "p1"}]}),
    "delete_project": status_only(204),
}
TRANSIENT = [
    status_only(500),
    status_only(503),
    _timeout,
    _drop,
    _read_error,
    _refused,
    _connect_timeout,
]


@pytest.mark.parametrize("op", READS)
@pytest.mark.parametrize("failure", TRANSIENT)
def test_reads_are_retried_then_succeed(make: Make, op: str, failure: object) -> None:
    gateway, rec = make(failure, failure, GOOD[op], retries=2)
    READS[op](gateway)
    assert rec.count == 3


@pytest.mark.parametrize("op", READS)
@pytest.mark.parametrize("failure", TRANSIENT)
def test_reads_exhausted_are_transient(make: Make, op: str, failure: object) -> None:
    gateway, rec = make(failure, retries=2)
    with pytest.raises(TransientGatewayError):
        READS[op](gateway)
    assert rec.count == 3


@pytest.mark.parametrize("op", READS)
def test_a_429_is_not_retried_and_carries_its_retry_after(make: Make, op: str) -> None:
    """The hop is deferred until then instead of holding its thread in a retry."""
    gateway, rec = make(httpx.Response(429, headers={"Retry-After": "30"}), GOOD[op], retries=2)
    with pytest.raises(TransientGatewayError, match="throttled") as raised:
        READS[op](gateway)
    assert raised.value.retry_after_s == 30.0
    assert rec.count == 1


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT", "Date": "Wed, 21 Oct 2015 07:27:30 GMT"},
         30.0),  # an HTTP date counts from the answer's own Date, not our clock
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT", "Date": "Wed, 21 Oct 2015 07:29:00 GMT"},
         0.0),  # already past
        ({"Retry-After": "soon"}, 0.0),
        ({"Retry-After": "7200"}, 3600.0),  # beyond an hour is not believed
    ],
)  # fmt: skip
def test_a_429_carries_a_retry_after_given_as_an_http_date(
    make: Make, headers: dict[str, str], seconds: float
) -> None:
    gateway, _ = make(httpx.Response(429, headers=headers), retries=0)
    with pytest.raises(TransientGatewayError, match="throttled") as raised:
        gateway.status("ws-1")
    assert raised.value.retry_after_s == seconds


def test_an_http_date_retry_after_without_a_date_counts_from_now() -> None:
    answer = gateway_answers.Answer(429, b"", "Wed, 21 Oct 2015 07:28:00 GMT")
    now = datetime(2015, 10, 21, 7, 27, 50, tzinfo=UTC)
    assert gateway_answers.retry_after(answer, now=now) == 10.0


def test_retries_zero_means_one_attempt(make: Make) -> None:
    gateway, rec = make(status_only(503), retries=0)
    with pytest.raises(TransientGatewayError):
        gateway.status("ws-1")
    assert rec.count == 1


@pytest.mark.parametrize("op", ["status", "family", "list_projects"])
def test_404_on_a_read_is_workspace_gone_not_retried(make: Make, op: str) -> None:
    gateway, rec = make(status_only(404))
    with pytest.raises(WorkspaceGone):
        READS[op](gateway)
    assert rec.count == 1


@pytest.mark.parametrize("op", READS)
@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (status_only(401), Unauthorized),
        (status_only(403), Unauthorized),
        (status_only(400, "bad"), RequestRejected),
        (status_only(409, "conflict"), RequestRejected),
        (status_only(301), MalformedAnswer),
        (_bad_gzip, MalformedAnswer),
    ],
)
def test_terminal_answers_on_reads_are_not_retried(
    make: Make, op: str, answer: object, error: type[GatewayError]
) -> None:
    gateway, rec = make(answer, GOOD[op])
    with pytest.raises(error):
        READS[op](gateway)
    assert rec.count == 1


def test_backoff_doubles_between_retries() -> None:
    rec = Recorder(
        status_only(503),
        status_only(502),
        status_only(500),
        httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        status_only(503),
    )
    sleeps: list[float] = []
    with HttpGateway(
        BASE, TOKEN, retries=4, retry_backoff_s=0.1, transport=httpx.MockTransport(rec)
    ) as gateway:
        gateway._sleep = sleeps.append
        with pytest.raises(TransientGatewayError, match="after 5 attempt"):
            gateway.status("ws-1")
    # 0.1*2**n; none after the last
    assert sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert rec.count == 5


# -- secrets --------------------------------------------------------------------------


def _echo_token(request: httpx.Request) -> httpx.Response:
    return ok({"error": f"bad header {request.headers['authorization']}"}, 400)


def _token_in_transport_message(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError(
        f"reset while sending {request.headers['authorization']}", request=request
    )


def _token_in_connect_message(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError(f"refused {request.headers['authorization']}", request=request)


LEAKY_CASES = [
    ("create_child", _timeout, AmbiguousCreate),
    ("create_child", _drop, AmbiguousCreate),
    ("create_child", _token_in_transport_message, AmbiguousCreate),
    ("create_child", _token_in_connect_message, TransientGatewayError),
    ("create_child", _bad_gzip, AmbiguousCreate),
    ("create_child", status_only(503), AmbiguousCreate),
    ("create_child", status_only(429), TransientGatewayError),
    ("create_child", status_only(401, TOKEN), Unauthorized),
    ("create_child", _echo_token, RequestRejected),
    ("create_child", status_only(422, f"quota for Bearer {TOKEN}"), RequestRejected),
    ("create_child", httpx.Response(200, text=TOKEN), MalformedAnswer),
    ("status", _timeout, TransientGatewayError),
    ("status", _token_in_transport_message, TransientGatewayError),
    ("status", _token_in_connect_message, TransientGatewayError),
    ("status", status_only(403, TOKEN), Unauthorized),
    ("status", status_only(404, TOKEN), WorkspaceGone),
    ("status", _echo_token, RequestRejected),
    ("status", _bad_gzip, MalformedAnswer),
    ("family", ok({"token": TOKEN}), MalformedAnswer),
    ("list_projects", status_only(404), WorkspaceGone),
    ("delete_project", status_only(500, TOKEN), TransientGatewayError),
]


@pytest.mark.parametrize(("op", "answer", "error"), LEAKY_CASES)
def test_the_token_never_leaks(
    make: Make, caplog: pytest.LogCaptureFixture, op: str, answer: object, error: type[GatewayError]
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway, _ = make(answer)
    call = READS.get(op, _create)
    with pytest.raises(error) as info:
        call(gateway)
    exc = info.value
    # No chained httpx exception (it holds the request, hence the headers).
    assert exc.__cause__ is None
    assert exc.__context__ is None
    texts = [
        str(exc),
        repr(exc),
        str(exc.__cause__),
        "".join(traceback.format_exception(exc)),
        repr(gateway),
        *(record.getMessage() for record in caplog.records),
    ]
    for text in texts:
        assert TOKEN not in text


def test_repr_has_no_token(make: Make) -> None:
    gateway, _ = make(ok({}))
    assert TOKEN not in repr(gateway)
    assert TOKEN not in str(gateway)
    assert "gateway.test" in repr(gateway)


def test_empty_token_refused() -> None:
    with pytest.raises(ValueError, match="token"):
        HttpGateway(BASE, "")


def test_context_manager_closes_the_client() -> None:
    rec = Recorder(ok({"status": "created"}))
    with HttpGateway(BASE, TOKEN, transport=httpx.MockTransport(rec)) as gateway:
        assert gateway.status("ws-1") == "created"
    with pytest.raises(RuntimeError):
        gateway.status("ws-1")


# -- httpx's transport on real sockets (loopback): behaviour the port relies on ----------


class _OneShotServer:
    """A loopback server that plays `script(conn, n)` for the n-th connection."""

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.finished = 0  # connections played and closed
        self._script = script
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                self._script(conn, self.connections)
            self.finished += 1

    def close(self) -> None:
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    """One request, its body too: a socket closed with a body unread resets the
    connection (a ReadError) rather than closing it (a RemoteProtocolError)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while length is not None and len(body) < int(length.group(1)):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _answer(conn: socket.socket, body: bytes, *, close: bool = False) -> None:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    if close:
        head += "Connection: close\r\n"
    conn.sendall(head.encode() + b"\r\n" + body)


def test_over_loopback_reuses_one_connection() -> None:
    def script(conn: socket.socket, _n: int) -> None:
        while _read_request(conn):
            _answer(conn, b'{"status": "created"}')

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN) as gateway:
        assert [gateway.status("ws-1") for _ in range(3)] == ["created"] * 3
    server.close()
    assert server.connections == 1


def test_over_loopback_never_reuses_a_connection_the_server_closed() -> None:
    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        _answer(conn, b'{"id": "ws-1"}')  # keep-alive promised, then closed anyway

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN) as gateway:
        assert gateway.create_child(PARENT, "A") == "ws-1"
        deadline = time.monotonic() + 5
        while server.finished < 1 and time.monotonic() < deadline:
            time.sleep(0.005)  # until the server has closed its end
        time.sleep(0.02)  # and its FIN has reached our socket
        assert gateway.create_child(PARENT, "B") == "ws-1"  # not AmbiguousCreate
    server.close()
    assert server.connections == 2


def test_over_loopback_failures_map_like_httpx() -> None:
    def drop(conn: socket.socket, _n: int) -> None:
        _read_request(conn)

    def hang(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        time.sleep(0.5)

    dropping, hanging = _OneShotServer(drop), _OneShotServer(hang)
    refused = socket.create_server(("127.0.0.1", 0))
    refused_url = f"http://127.0.0.1:{refused.getsockname()[1]}"
    refused.close()
    with HttpGateway(dropping.url, TOKEN, retries=0) as gateway:
        with pytest.raises(AmbiguousCreate, match="RemoteProtocolError"):
            gateway.create_child(PARENT, "T")
        with pytest.raises(TransientGatewayError, match="RemoteProtocolError"):
            gateway.status("ws-1")
    with (
        HttpGateway(hanging.url, TOKEN, retries=0, read_timeout=0.1) as gateway,
        pytest.raises(AmbiguousCreate, match="ReadTimeout"),
    ):
        gateway.create_child(PARENT, "T")
    with (
        HttpGateway(refused_url, TOKEN, retries=0) as gateway,
        pytest.raises(TransientGatewayError, match="ConnectError"),
    ):
        gateway.create_child(PARENT, "T")
    dropping.close()
    hanging.close()


def test_over_loopback_sends_the_contract_request() -> None:
    seen: list[bytes] = []

    def script(conn: socket.socket, _n: int) -> None:
        request = _read_request(conn)
        length = int(request.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = request.split(b"\r\n\r\n", 1)[1]
        while len(body) < length:
            body += conn.recv(65536)
        seen.append(request.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n" + body)
        _answer(conn, b'{"id": "ws-7"}', close=True)

    server = _OneShotServer(script)
    with HttpGateway(server.url + "/api/", TOKEN) as gateway:
        assert gateway.create_child("p/1", "Brand é") == "ws-7"
    server.close()
    head, body = seen[0].split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /api/v2/workspaces/p%2F1/child HTTP/1.1"
    headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines[1:])}
    assert headers[b"authorization"] == f"Bearer {TOKEN}".encode()
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"host"] == server.url.removeprefix("http://").encode()
    assert json.loads(body) == {"title": "Brand é", "resources": {}}


def test_over_loopback_reads_retry_after_and_refuses_gzip_it_did_not_ask_for() -> None:
    asked: list[bytes] = []

    def script(conn: socket.socket, n: int) -> None:
        while request := _read_request(conn):
            asked.append(request)
            if n == 1:
                conn.sendall(
                    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0.25\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            body = gzip.compress(b'{"status": "created"}')
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN, retries=1, retry_backoff_s=0.01) as gateway:
        with pytest.raises(TransientGatewayError) as raised:
            gateway.status("ws-1")
        assert raised.value.retry_after_s == 0.25
        with pytest.raises(MalformedAnswer, match="compressed"):
            gateway.status("ws-1")
    server.close()
    assert all(b"\r\naccept-encoding: identity\r\n" in r.lower() for r in asked)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'9\r\n{"status"\r\n0c;ext=1\r\n: "created"}\r\n0\r\nX-Trailer: t\r\n\r\n',
        b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"status": "created"}',
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b'HTTP/1.1 200 OK\r\nContent-Length: 21\r\nConnection: close\r\n\r\n{"status": "created"}',
    ],
    ids=["chunked", "http1.0-to-close", "interim-100"],
)
def test_over_loopback_reads_every_body_framing(answer: bytes) -> None:
    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        conn.sendall(answer)

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN, retries=0) as gateway:
        assert gateway.status("ws-1") == "created"
        assert gateway.status("ws-1") == "created"  # a second connection: not kept
    server.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["status-line", "short-body", "chunk-size"],
)
def test_over_loopback_malformed_answers_make_a_create_ambiguous(answer: bytes) -> None:
    _create_answered(answer)


def _create_answered(answer: bytes) -> None:
    """A create answered with these bytes is ambiguous (its outcome unknown)."""

    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        conn.sendall(answer)

    server = _OneShotServer(script)
    with (
        HttpGateway(server.url, TOKEN, retries=0) as gateway,
        pytest.raises(AmbiguousCreate, match="outcome unknown"),
    ):
        gateway.create_child(PARENT, "T")
    server.close()


def test_over_loopback_refuses_an_answer_over_its_size_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gateway_module, "_ANSWER_MAX", 1000)

    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        _answer(conn, b'{"status": "' + b"x" * 2000 + b'"}')

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN, retries=2) as gateway:
        with pytest.raises(MalformedAnswer, match="larger than 1000 bytes"):
            gateway.status("ws-1")
        with pytest.raises(AmbiguousCreate, match="larger than 1000 bytes"):
            gateway.create_child(PARENT, "T")  # it may have been made: recovered
    server.close()
    assert server.connections == 2  # a read refused so is not retried


def test_over_loopback_an_endless_answer_is_never_read_whole() -> None:
    sent: list[int] = [0]

    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n[")
        with contextlib.suppress(OSError):  # until the client hangs up
            while sent[0] < 1_000_000_000:
                conn.sendall(b"1," * 32768)
                sent[0] += 65536

    server = _OneShotServer(script)
    with (
        HttpGateway(server.url, TOKEN, retries=0) as gateway,
        pytest.raises(MalformedAnswer, match=f"larger than {gateway_module._ANSWER_MAX} bytes"),
    ):
        gateway.status("ws-1")
    server.close()
    assert sent[0] < 64 * 1024 * 1024  # the cap and what the sockets buffer, not a gigabyte


def test_a_token_that_could_inject_a_header_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="token") as caught:
        HttpGateway("http://127.0.0.1:9", "tok\r\nX-Injected: 1")
    assert "Injected" not in str(caught.value)


def test_a_header_with_a_line_break_is_never_sent() -> None:
    received: list[bytes] = []

    def script(conn: socket.socket, _n: int) -> None:
        received.append(_read_request(conn))
        _answer(conn, b'{"id": "ws-1"}')

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN, retries=0) as gateway:
        gateway._client.headers["X-Trace"] = "a\r\nX-Injected: 1"
        # Refused before sending: not ambiguous.
        with pytest.raises(TransientGatewayError, match="LocalProtocolError"):
            gateway.create_child(PARENT, "T")
    server.close()
    assert not any(received)  # a connection may have opened; nothing was written on it


def _chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


_TWICE_GZIPPED = gzip.compress(gzip.compress(b'{"id": "ws-1"}'))


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        + _chunked(gzip.compress(b'{"id": "ws-1"}')),
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        + _chunked(gzip.compress(b'{"id": "ws-1"}')),
        b"HTTP/1.1 201 Created\r\nContent-Encoding: gzip\r\nContent-Encoding: gzip\r\n"
        + f"Content-Length: {len(_TWICE_GZIPPED)}\r\nConnection: close\r\n\r\n".encode()
        + _TWICE_GZIPPED,
    ],
    ids=["transfer-coding-list", "transfer-coding-repeated", "content-coding-twice"],
)
def test_over_loopback_never_misreads_a_created_answer_it_cannot_undo(
    answer: bytes,
) -> None:
    # The workspace was created: an answer read as not JSON (MalformedAnswer) would
    # fail the attempt and orphan it; an unreadable one is ambiguous, and recovered.
    _create_answered(answer)


def test_over_loopback_reads_an_answer_sent_before_the_request_was_read() -> None:
    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)  # the head: the rest is never read, so closing resets
        conn.sendall(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 15\r\n"
            b'Connection: close\r\n\r\n{"error":"big"}'
        )

    server = _OneShotServer(script)
    with (
        HttpGateway(server.url, TOKEN, retries=0) as gateway,
        pytest.raises(RequestRejected, match="413"),  # not AmbiguousCreate, as with httpx
    ):
        gateway.create_child(PARENT, "x" * 16_000_000)  # far beyond the socket buffers
    server.close()


def test_over_loopback_takes_an_empty_body_whatever_its_content_encoding() -> None:
    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Encoding: gzip\r\n\r\n")

    server = _OneShotServer(script)
    with HttpGateway(server.url, TOKEN, retries=0) as gateway:
        gateway.delete_project("ws-1", "p-1")  # success, as through httpx
    server.close()


def test_over_loopback_refuses_an_endless_header_section() -> None:
    def script(conn: socket.socket, _n: int) -> None:
        _read_request(conn)
        with contextlib.suppress(OSError):  # the client hangs up mid-way
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 200_000 + b"\r\n\r\n")

    server = _OneShotServer(script)
    with (
        HttpGateway(server.url, TOKEN, retries=0) as gateway,
        pytest.raises(TransientGatewayError, match="RemoteProtocolError"),
    ):
        gateway.status("ws-1")
    server.close()
