"""A family listing read as it arrives (infrastructure/gateway/family.py, decision 032):
through `HttpGateway` over httpx.MockTransport, and the parser alone."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest

from domain.ports import FamilyMember, MalformedAnswer
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.gateway.answers import Unreadable
from infrastructure.gateway.family import (
    ENTRY_MAX,
    FAMILY_ANSWER_MAX,
    FamilyWatch,
    Listing,
    read_family,
)
from tests.support import ManualClock

TOKEN = "tok-SECRET-5f3a9c"
PARENT = "parent-1"


class Chunked(httpx.SyncByteStream):
    """A body that arrives `size` bytes at a time, as from the network."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    def __iter__(self) -> Iterator[bytes]:
        for at in range(0, len(self.body), self.size):
            yield self.body[at : at + self.size]


def listing(others: int, *wanted: str) -> list[dict[str, str]]:
    """The parent, `others` children of other titles, then one child per wanted title."""
    members = [{"id": PARENT, "title": "Organisation", "status": "active"}]
    members += [
        {"id": f"ws-{n:06d}", "title": f"Brand {n}", "status": "ready"} for n in range(others)
    ]
    members += [{"id": f"ws-w{n}", "title": t, "status": "not ready"} for n, t in enumerate(wanted)]
    return members


def gateway_for(*bodies: bytes, chunk: int = 65_536, **kwargs: object) -> HttpGateway:
    answers = list(bodies)
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        body = answers.pop(0) if len(answers) > 1 else answers[0]
        return httpx.Response(200, stream=Chunked(body, chunk))

    gateway = HttpGateway(
        "http://gateway.test", TOKEN, retries=2, retry_backoff_s=0,
        transport=httpx.MockTransport(handler), **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    gateway.calls = calls  # type: ignore[attr-defined]
    return gateway


def test_a_family_of_12000_members_reads_whole_and_keeps_only_the_wanted_title() -> None:
    body = json.dumps(listing(12_000, "Brand A", "Brand A")).encode()
    with gateway_for(body) as gateway:
        assert gateway.family(PARENT, "Brand A") == [
            FamilyMember("ws-w0", "Brand A", "not ready"),
            FamilyMember("ws-w1", "Brand A", "not ready"),
        ]
        everyone = gateway.family(PARENT)  # the audit's read: every member
    assert len(everyone) == 12_003
    assert everyone[0] == FamilyMember(PARENT, "Organisation", "active")


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunk_boundaries_anywhere_read_the_same(chunk: int) -> None:
    members = listing(40, 'Brand é \u2603 \\" ]},{')  # multibyte, escapes, brackets in a title
    body = json.dumps(members, indent=1).encode()  # with whitespace between every token
    with gateway_for(body, chunk=chunk) as gateway:
        (wanted,) = gateway.family(PARENT, members[-1]["title"])
        assert len(gateway.family(PARENT)) == len(members)
    assert wanted.id == "ws-w0"


def test_a_listing_past_its_bound_is_refused_clearly_and_not_retried() -> None:
    body = json.dumps(listing(1000)).encode()
    shares: list[float] = []
    with gateway_for(
        body, family_max_bytes=len(body) - 1, on_family_share=shares.append
    ) as gateway:
        with pytest.raises(MalformedAnswer) as caught:
            gateway.family(PARENT, "T")
        assert len(gateway.calls) == 1  # type: ignore[attr-defined]
    assert shares == [1.0]  # the gauge shows it refused
    assert str(caught.value) == (
        f"family: a family listing larger than {len(body) - 1} bytes, the bound of one "
        "listing: this parent has too many children to be read (decision 032)"
    )


def test_the_default_bound_holds_100000_members_of_long_titles() -> None:
    entry = {"id": "w" * 128, "title": "t" * 400, "status": "creation failed"}
    assert 100_000 * (len(json.dumps(entry)) + 2) < FAMILY_ANSWER_MAX


def test_ids_of_wanted_members_are_still_checked() -> None:
    members = [*listing(10), {"id": "has space", "title": "Brand A", "status": "ready"}]
    members.append({"id": f"ws-{TOKEN}", "title": "Brand B", "status": "ready"})
    with gateway_for(json.dumps(members).encode()) as gateway:
        with pytest.raises(MalformedAnswer, match="not matching"):
            gateway.family(PARENT, "Brand A")
        with pytest.raises(MalformedAnswer, match="credentials") as caught:
            gateway.family(PARENT, "Brand B")
        assert [m.id for m in gateway.family(PARENT, "Brand 3")] == ["ws-000003"]
    assert TOKEN not in str(caught.value)


def _read(body: bytes, title: str | None = "T", chunk: int = 3) -> Listing:
    return read_family((body[at : at + chunk] for at in range(0, len(body), chunk)), title)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "bare JSON array"),
        (b'{"id": "x"}', "bare JSON array"),
        (b"[1, 2]", "array of objects"),
        (b'[{"id": "x"},]', "array of objects"),
        (b'[{"id": "x"} {"id": "y"}]', "between entries"),
        (b'[{"id": "x"}] []', "after the JSON array"),
        (b'[{"id": "x"}', "cut before its end"),
        (b'[{"id": "x", "title": "T"', "cut before its end"),
        (b'[{"id": x}]', "not JSON"),
        (b'[{"title": "\xff"}]', "not UTF-8"),
        (b'[{"n": ' + b"9" * 5000 + b"}]", "number too long"),
        (b'[{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}]", "too deep"),
        (b'[{"title": "' + b"x" * (ENTRY_MAX + 10) + b"]", f"whole in {ENTRY_MAX}"),
        (b'[{"t": "}"}, 3, {"t": "}"}]', "array of objects"),
    ],
    ids=lambda value: value[:30] if isinstance(value, bytes) else "",
)
def test_a_listing_outside_the_shape_is_unreadable(body: bytes, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        _read(body, chunk=4096)


def test_the_parser_agrees_with_json_loads() -> None:
    members = [*listing(30, "T", "T"), {"id": "ws-z", "title": "T", "extra": {"k": [1, {}]}}]
    body = ("\ufeff" + json.dumps(members, ensure_ascii=False)).encode()
    for chunk in (1, 2, 5, 11, 1000):
        got = _read(body, chunk=chunk)
        assert got.wanted == [m for m in members if m.get("title") == "T"]
        assert (got.entries, got.size) == (len(members), len(body))
    assert _read(b" [ ] ", None) == Listing([], 0, 5)


def test_a_long_entry_is_tried_a_few_times_not_once_a_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from infrastructure.gateway import family as gateway_family

    tries = 0
    real = gateway_family._DECODER.raw_decode

    class Counting:
        def raw_decode(self, text: str, pos: int) -> tuple[object, int]:
            nonlocal tries
            tries += 1
            return real(text, pos)

    monkeypatch.setattr(gateway_family, "_DECODER", Counting())
    body = b'[{"title": "' + b"x" * 60_000 + b'"}]'
    assert _read(body, None, chunk=16).entries == 1
    assert tries < 20  # 3,750 chunks


@pytest.mark.parametrize("title", ["Brand {n}", "B}}}}n", "Brand {n}, {n}"])
def test_titles_holding_braces_cost_a_few_decodings_a_chunk(
    monkeypatch: pytest.MonkeyPatch, title: str
) -> None:
    from types import SimpleNamespace

    from infrastructure.gateway import family as gateway_family

    decoded = 0  # characters handed to the decoder, batches and single entries alike

    def loads(text: str) -> object:
        nonlocal decoded
        decoded += len(text)
        return json.loads(text)

    class Counting:
        def raw_decode(self, text: str, pos: int) -> tuple[object, int]:
            nonlocal decoded
            entry, end = json.JSONDecoder().raw_decode(text, pos)
            decoded += end - pos
            return entry, end

    fake_json = SimpleNamespace(loads=loads, JSONDecodeError=json.JSONDecodeError)
    monkeypatch.setattr(gateway_family, "json", fake_json)
    monkeypatch.setattr(gateway_family, "_DECODER", Counting())
    members = [{"id": f"ws-{n}", "title": title.replace("n", str(n))} for n in range(5000)]
    body = json.dumps(members).encode()
    assert _read(body, "Brand 7", chunk=16_384).entries == 5000
    # A failed batch costs a chunk; a chunk tries at most a few, then goes one entry at
    # a time: never a batch per entry (that was 5 to 40 times the body here).
    assert decoded < 3 * len(body)


def test_a_family_near_its_bound_is_warned_about_hourly_and_gauged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shares: list[float] = []
    clock = ManualClock()
    watch = FamilyWatch(1000, shares.append, clock)
    with caplog.at_level(logging.WARNING, "infrastructure.gateway.family"):
        watch.seen("p-small", Listing([], 10, 100))
        watch.seen("p-big", Listing([], 90, 850))
        watch.seen("p-big", Listing([], 91, 860))  # within the hour: not again
        clock.advance(3600)
        watch.seen("p-big", Listing([], 92, 870))
        watch.seen("p-small", Listing([], 11, 110))
    assert shares == [0.1, 0.85, 0.86, 0.87, 0.87]  # the largest of each parent's last
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert warned[0] == (
        "the family of parent p-big nears its listing's bound: 90 entries, 850 bytes, 85% "
        "of 1000; past it every hop and audit of this parent fails (decision 032)"
    )


def test_the_gateway_reports_the_share_of_each_listing() -> None:
    shares: list[float] = []
    body = json.dumps(listing(100)).encode()
    with gateway_for(body, family_max_bytes=2 * len(body), on_family_share=shares.append) as gw:
        gw.family(PARENT, "T")
    assert shares == [0.5]


def test_the_share_is_a_gauge_in_metrics() -> None:
    from prometheus_client import REGISTRY, generate_latest

    from worker.health import metrics

    body = json.dumps(listing(100)).encode()
    with gateway_for(
        body, family_max_bytes=4 * len(body), on_family_share=metrics.observe_family_share
    ) as gateway:
        gateway.family(PARENT, "T")
    assert "provisioner_gateway_family_bound_share 0.25" in generate_latest(REGISTRY).decode()


def test_one_read_keeps_the_entries_of_several_titles() -> None:
    body = json.dumps(listing(500, "Brand A", "Brand B", "Brand C")).encode()
    with gateway_for(body) as gateway:
        kept = gateway.family_titled(PARENT, frozenset({"Brand A", "Brand C"}))
    assert [m.title for m in kept] == ["Brand A", "Brand C"]
    assert len(gateway.calls) == 1  # type: ignore[attr-defined]


def test_the_bytes_of_every_answer_are_counted_by_operation() -> None:
    body = json.dumps(listing(300, "Brand A")).encode()
    counted: list[tuple[str, int]] = []
    with gateway_for(body, chunk=1000, on_bytes=lambda op, n: counted.append((op, n))) as gw:
        gw.family(PARENT, "Brand A")
        gw.family(PARENT)
    assert counted == [("family", len(body)), ("family", len(body))]


def test_a_listing_refused_past_its_bound_counts_the_bytes_read() -> None:
    body = json.dumps(listing(300)).encode()
    counted: list[tuple[str, int]] = []
    with (
        gateway_for(
            body, family_max_bytes=4096, on_bytes=lambda op, n: counted.append((op, n))
        ) as gw,
        pytest.raises(MalformedAnswer),
    ):
        gw.family(PARENT, "Brand A")
    assert counted == [("family", 4096)]
