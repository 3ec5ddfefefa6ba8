"""`provisioner dead-letters` on RabbitMQ: listing consumes nothing, keeps the
order and starts with the counts by reason; ids are stable, across replays too,
and a unique prefix names one; replay puts a message back where it came from with
its own content type and encoding and without the dead-letter headers; purge
takes ids or reasons (or --all) and asks for --yes; memory:// says it keeps none.
A large body is dead-lettered cut, with its length and hash, and is never
replayed; a listing pages through the queue holding one page of letters at a
time."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from typing import Any

import pytest
from click.testing import CliRunner
from kombu import Connection, Queue

from infrastructure.broker.dead_letter_parsing import NotReplayable
from infrastructure.broker.dead_letters import DeadLetters
from infrastructure.broker.messages import MAX_BODY_BYTES
from infrastructure.broker.publisher import DEAD_BODY_KEPT, Broker
from infrastructure.broker.topology import (
    COMMAND_KEY,
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    EXCHANGE,
    HOPS_QUEUE,
    WORK_KEY,
    Topology,
)
from infrastructure.failures import EXIT_CONFIGURATION
from tests.integration.messaging_support import dead_letters_cli, publish_raw, raw, take_all
from tests.support import settler
from worker.cli.main import main

MIB = 1024 * 1024

pytestmark = pytest.mark.rabbitmq


def seed(url: str) -> None:
    """Three dead letters from the worker (with the labels older ones were written
    with), then one the hops queue dead-letters itself."""
    broker = Broker(url, Topology(), scheduler=None)
    try:
        broker.declare()
        broker.publish_dead(b'{"n": 1}', "schema errors", {"hop": "missing"}, WORK_KEY)
        broker.publish_dead(b'{"n": 2}', "unknown brand", {"brand": "b-2"}, COMMAND_KEY)
        broker.publish_dead(b'{"n": 3}', "schema errors", {"hop": "bad"}, WORK_KEY)
    finally:
        broker.close()
    publish_raw(url, b'{"n": 4}', WORK_KEY, "application/json", "utf-8", {"x-keep": "yes"})
    with Connection(url) as conn:
        queue = Queue(HOPS_QUEUE, no_declare=True).bind(conn.channel())
        message = queue.get(no_ack=False)
        assert message is not None
        message.reject(requeue=False)  # the queue's own dead-lettering: x-death


def bodies(url: str, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    return [(raw(m.body), dict(m.headers or {})) for m in take_all(url, queue)]


def test_listing_consumes_nothing_keeps_the_order_and_the_ids(rabbit_url: str) -> None:
    seed(rabbit_url)
    with DeadLetters(rabbit_url) as letters:
        first = letters.page().letters
        second = list(letters.each())
        counts = letters.counts_by_reason()

    assert [x.body for x in first] == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}', b'{"n": 4}']
    assert [x.id for x in first] == [x.id for x in second]
    assert len({x.id for x in first}) == 4
    assert [x.source_queue for x in first] == [HOPS_QUEUE, COMMANDS_QUEUE, HOPS_QUEUE, HOPS_QUEUE]
    assert [x.reason for x in first] == ["schema_error", "unknown_brand", "schema_error",
                                         "rejected"]  # fmt: skip
    assert [x.stored_reason for x in first] == ["schema errors", "unknown brand",
                                                "schema errors", ""]  # fmt: skip
    assert first[1].errors == {"brand": "b-2"}
    assert counts == {"schema_error": 2, "unknown_brand": 1, "rejected": 1}
    assert all(x.age_s(x.dead_at or 0) is not None for x in first)

    listed = dead_letters_cli(rabbit_url, "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [x["id"] for x in json.loads(listed.stdout)] == [x.id for x in first]
    counted = "4 dead letter(s) in all: 2 schema_error, 1 rejected, 1 unknown_brand"
    assert counted in listed.stderr
    text = dead_letters_cli(rabbit_url, "list", "--limit", "1")
    assert text.output.splitlines()[0] == counted  # of the whole queue, not the page
    text = dead_letters_cli(rabbit_url, "list")
    assert "unknown_brand (unknown brand)" in text.output
    assert "brand: b-2" in text.output
    assert "4 dead letter(s)" in text.output
    assert len(take_all(rabbit_url, DEAD_QUEUE)) == 4  # still all there


def test_show_and_replay_one_then_all(rabbit_url: str) -> None:
    seed(rabbit_url)
    with DeadLetters(rabbit_url) as letters:
        ids = [x.id for x in letters.each()]

    shown = dead_letters_cli(rabbit_url, "show", ids[1])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["reason"] == "unknown_brand"
    assert dead_letters_cli(rabbit_url, "show", "nope").exit_code == 1

    one = dead_letters_cli(rabbit_url, "replay", ids[1])
    assert one.exit_code == 0, one.output
    assert f"replayed {ids[1]} to {EXCHANGE}/{COMMAND_KEY}" in one.output
    assert bodies(rabbit_url, COMMANDS_QUEUE) == [(b'{"n": 2}', {"x-dead-id": ids[1]})]
    with DeadLetters(rabbit_url) as letters:
        assert [x.id for x in letters.each()] == [ids[0], ids[2], ids[3]]

    assert dead_letters_cli(rabbit_url, "replay").exit_code == 2  # an id or --all
    every = dead_letters_cli(rabbit_url, "replay", "--all")
    assert "3 dead letter(s) replayed" in every.output
    assert bodies(rabbit_url, HOPS_QUEUE) == [
        (b'{"n": 1}', {"x-dead-id": ids[0]}), (b'{"n": 3}', {"x-dead-id": ids[2]}),
        (b'{"n": 4}', {"x-keep": "yes", "x-dead-id": ids[3]}),
    ]  # fmt: skip
    assert take_all(rabbit_url, DEAD_QUEUE) == []


def unique_prefix(letter_id: str, ids: list[str]) -> str:
    """The shortest prefix of `letter_id` no other id starts with."""
    others = [x for x in ids if x != letter_id]
    return next(letter_id[:n] for n in range(1, len(letter_id) + 1)
                if not any(x.startswith(letter_id[:n]) for x in others))  # fmt: skip


def held(url: str) -> list[str]:
    with DeadLetters(url) as letters:
        return [x.id for x in letters.each()]


def test_purge_takes_ids_or_reasons_and_all_only_when_asked(rabbit_url: str) -> None:
    seed(rabbit_url)
    ids = held(rabbit_url)

    for refused in (["purge"], ["purge", "--yes"], ["purge", ids[1]],
                    ["purge", "--all"], ["purge", "--all", ids[1], "--yes"],
                    ["purge", "--reason", "no_such_reason", "--yes"]):  # fmt: skip
        result = dead_letters_cli(rabbit_url, *refused)
        assert result.exit_code == 2, (refused, result.output)
    assert "--reason" in dead_letters_cli(rabbit_url, "purge").output  # says how, deletes nothing
    assert "--all" in dead_letters_cli(rabbit_url, "purge", "--yes").output
    assert held(rabbit_url) == ids

    one = dead_letters_cli(rabbit_url, "purge", unique_prefix(ids[1], ids), "--yes")
    assert one.exit_code == 0, one.output
    assert f"purged {ids[1]} (unknown_brand, from {COMMANDS_QUEUE})" in one.output
    assert held(rabbit_url) == [ids[0], ids[2], ids[3]]

    by_reason = dead_letters_cli(rabbit_url, "purge", "--reason", "schema_error", "--yes")
    assert by_reason.exit_code == 0, by_reason.output
    assert "2 dead letter(s) purged" in by_reason.output
    assert held(rabbit_url) == [ids[3]]  # the order of the rest is kept

    every = dead_letters_cli(rabbit_url, "purge", "--all", "--yes")
    assert every.exit_code == 0, every.output
    assert "1 dead letter(s) purged" in every.output
    assert take_all(rabbit_url, DEAD_QUEUE) == []


def test_an_ambiguous_prefix_is_refused_naming_the_matches(rabbit_url: str) -> None:
    broker = Broker(rabbit_url, Topology(), scheduler=None)
    try:
        broker.declare()
        for letter_id in ("abc111", "abc222"):
            broker.publish_dead(b'{"n": 1}', "schema_error", {}, WORK_KEY,
                                kept={"x-dead-id": letter_id})  # fmt: skip
    finally:
        broker.close()

    for command in (["show", "abc"], ["replay", "abc"], ["purge", "abc", "--yes"]):
        result = dead_letters_cli(rabbit_url, *command)
        assert result.exit_code == 1, result.output
        assert "ambiguous" in result.output
        assert "abc111, abc222" in result.output
    assert held(rabbit_url) == ["abc111", "abc222"]  # nothing replayed or purged
    assert json.loads(dead_letters_cli(rabbit_url, "show", "abc2").output)["id"] == "abc222"
    assert "no dead letter abd" in dead_letters_cli(rabbit_url, "show", "abd").output


def test_replay_keeps_the_content_type_and_encoding_and_the_id(rabbit_url: str) -> None:
    # One the worker refuses for its content type, one the hops queue rejects itself.
    publish_raw(rabbit_url, b"plain words", WORK_KEY, "text/plain", "us-ascii", {})
    publish_raw(rabbit_url, b"<hop/>", WORK_KEY, "application/xml", "binary", {})
    publisher = Broker(rabbit_url, Topology(), scheduler=None)
    try:
        with Connection(rabbit_url) as conn:
            queue = Queue(HOPS_QUEUE, no_declare=True).bind(conn.channel())

            def again() -> None:
                """The worker reads the first again, the queue rejects the second."""
                plain, xml = queue.get(no_ack=False), queue.get(no_ack=False)
                assert plain is not None
                assert xml is not None
                reader = settler(publisher, (1.0,), connection_errors=(ConnectionError,))
                assert reader.read(plain, HOPS_QUEUE) is None
                xml.reject(requeue=False)

            again()
            with DeadLetters(rabbit_url) as letters:
                first = letters.page().letters
            assert [(x.reason, x.content_type, x.content_encoding) for x in first] == [
                ("unsupported_content_type", "text/plain", "us-ascii"),
                ("rejected", "application/xml", "binary"),
            ]

            every = dead_letters_cli(rabbit_url, "replay", "--all")
            assert every.exit_code == 0, every.output
            plain, xml = queue.get(no_ack=False), queue.get(no_ack=False)
            assert plain is not None
            assert xml is not None
            got = [(raw(m.body), m.content_type, m.content_encoding) for m in (plain, xml)]
            assert got == [(b"plain words", "text/plain", "us-ascii"),
                           (b"<hop/>", "application/xml", "binary")]  # fmt: skip
            assert plain.headers == {"x-dead-id": first[0].id}
            plain.requeue()
            xml.requeue()

            again()  # the same refusal as before, not "invalid JSON"
            with DeadLetters(rabbit_url) as letters:
                second = letters.page().letters
    finally:
        publisher.close()
    assert [(x.id, x.reason) for x in second] == [(x.id, x.reason) for x in first]


def test_the_embedded_broker_says_it_keeps_none() -> None:
    result = CliRunner().invoke(
        main, ["dead-letters", "list"], env={"PROVISIONER_BROKER_URL": "memory://"}
    )
    assert result.exit_code == EXIT_CONFIGURATION
    assert "embedded broker (memory://) keeps dead letters only inside" in result.output


def large(n: int, size: int) -> bytes:
    """A hop-shaped body of `size` bytes, each one different."""
    head = b'{"type": "hop", "version": 1, "n": %d, "pad": "' % n
    return head + b"x" * (size - len(head) - 2) + b'"}'


def dead_letter_through_the_worker(url: str, bodies: list[bytes]) -> None:
    """Publish the bodies to the hops queue, take each delivery and let the worker's
    `Settler` dead-letter it (scrubbed, published, acked) as its `read` does with a
    body that `decode` refuses."""
    for body in bodies:
        publish_raw(url, body, WORK_KEY, "application/json", "utf-8", {})
    publisher = Broker(url, Topology(), scheduler=None)
    settle = settler(publisher, (1.0,), connection_errors=(ConnectionError,))
    try:
        with Connection(url) as conn:
            queue = Queue(HOPS_QUEUE, no_declare=True).bind(conn.channel())
            for _ in bodies:
                message = queue.get(no_ack=False)
                assert message is not None
                size = len(message.body)
                reason = "too large" if size > MAX_BODY_BYTES else "schema errors"
                settle.dead(message, reason, {"size": size})
                assert message.acknowledged
    finally:
        publisher.close()


def test_a_large_body_is_dead_lettered_cut_with_its_length_and_hash(rabbit_url: str) -> None:
    big = [large(n, 8 * MIB) for n in range(4)]
    small = b'{"type": "hop", "version": 1, "attempt_id": 7, "hop": 0}'  # schema errors
    dead_letter_through_the_worker(rabbit_url, [*big, small])

    with DeadLetters(rabbit_url) as letters:
        listed = letters.page().letters
        whole = listed[-1]
        with pytest.raises(NotReplayable, match="cannot be replayed"):
            letters.replay(listed[0].id)
    assert [x.reason for x in listed] == ["too_large"] * 4 + ["schema_error"]
    for letter, body in zip(listed, big, strict=False):
        assert letter.truncated
        assert letter.body == body[:DEAD_BODY_KEPT]
        assert letter.body_bytes == len(body)
        assert letter.body_sha256 == hashlib.sha256(body).hexdigest()
    assert (whole.truncated, whole.body, whole.body_bytes) == (False, small, len(small))

    shown = dead_letters_cli(rabbit_url, "show", listed[0].id)
    assert json.loads(shown.output)["truncated"] is True
    refused = dead_letters_cli(rabbit_url, "replay", listed[1].id)
    assert refused.exit_code == 1
    assert "cannot be replayed" in refused.output
    assert "not the whole body" in refused.output
    every = dead_letters_cli(rabbit_url, "replay", "--all")
    assert every.exit_code == 0, every.output
    assert "1 dead letter(s) replayed; 4 kept, truncated" in every.output
    assert f"kept {listed[0].id}: its body is not whole" in every.output
    assert bodies(rabbit_url, HOPS_QUEUE) == [(small, {"x-dead-id": whole.id})]

    held = take_all(rabbit_url, DEAD_QUEUE)  # what sits in the queue, raw
    assert len(held) == 4
    for message, body in zip(held, big, strict=True):
        assert len(message.body) == DEAD_BODY_KEPT
        assert message.headers["x-dead-body-bytes"] == len(body)
        assert message.headers["x-dead-body-sha256"] == hashlib.sha256(body).hexdigest()
        assert message.headers["x-dead-truncated"] is True
        assert len(json.dumps(message.headers, default=str)) < 1024


def rejected(url: str, bodies: list[bytes]) -> None:
    """The bodies dead-lettered whole by the hops queue itself (rejected: x-death)."""
    for body in bodies:
        publish_raw(url, body, WORK_KEY, "application/json", "utf-8", {})
    with Connection(url) as conn:
        queue = Queue(HOPS_QUEUE, no_declare=True).bind(conn.channel())
        for _ in bodies:
            message = queue.get(no_ack=False)
            assert message is not None
            message.reject(requeue=False)


def test_listing_pages_through_the_queue_holding_one_page(rabbit_url: str) -> None:
    # Dead-lettered whole by the queue: 6 x 8 MiB sit in it, each replayable.
    big = [large(n, 8 * MIB) for n in range(6)]
    rejected(rabbit_url, big)
    dead_letter_through_the_worker(rabbit_url, [large(n, 100_000) for n in range(6, 9)])

    tracemalloc.start()
    try:
        with DeadLetters(rabbit_url) as letters:
            pages = [letters.page(4)]
            while pages[-1].after:
                pages.append(letters.page(4, pages[-1].after))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [len(p.letters) for p in pages] == [4, 4, 1]
    assert [p.more for p in pages] == [True, True, False]
    listed = [letter for p in pages for letter in p.letters]
    assert len({x.id for x in listed}) == 9
    assert [x.reason for x in listed] == ["rejected"] * 6 + ["too_large"] * 3
    assert all(len(x.body) == DEAD_BODY_KEPT for x in listed)
    assert [x.body_bytes for x in listed[:6]] == [8 * MIB] * 6
    assert not any(x.truncated for x in listed[:6])  # the queue holds them whole
    # One message at hand at a time (py-amqp joins its frames: about twice its size),
    # never the 48 MiB of bodies the queue holds.
    assert peak < 3 * 8 * MIB, peak

    first = dead_letters_cli(rabbit_url, "list", "--limit", "4")
    assert first.exit_code == 0, first.output
    assert f"4 dead letter(s); more after {listed[3].id}" in first.output
    last = dead_letters_cli(rabbit_url, "list", "--limit", "4", "--after", listed[7].id)
    assert "1 dead letter(s)" in last.output
    assert "more after" not in last.output
    assert "(cut to 8192 of 100000 bytes)" in last.output
    as_json = dead_letters_cli(
        rabbit_url, "list", "--json", "--limit", "2", "--after", listed[1].id
    )
    assert [x["id"] for x in json.loads(as_json.stdout)] == [listed[2].id, listed[3].id]
    assert f"--after {listed[3].id}" in as_json.stderr
    gone = dead_letters_cli(rabbit_url, "list", "--after", "no-such-letter")
    assert gone.exit_code == 1
    assert "no dead letter no-such-letter" in gone.output

    # A whole one replays whole; all nine are still there (nothing consumed).
    assert len(take_all(rabbit_url, DEAD_QUEUE)) == 9


def test_the_web_page_shows_one_page_and_links_the_next(rabbit_url: str, tmp_path: Any) -> None:
    from starlette.testclient import TestClient

    from infrastructure.broker.dead_letters import PAGE
    from infrastructure.settings.model import Settings
    from worker.web.app import create_app

    broker = Broker(rabbit_url, Topology(), scheduler=None)
    try:
        broker.declare()
        for n in range(PAGE + 5):
            broker.publish_dead(b'{"n": %d}' % n, "schema errors", {}, WORK_KEY)
        broker.publish_dead(large(0, 100_000), "too large", {}, WORK_KEY)
    finally:
        broker.close()
    with DeadLetters(rabbit_url) as letters:
        ids = [x.id for x in letters.each()]
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'none.sqlite'}",
            "PROVISIONER_BROKER_URL": rabbit_url,
        }
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080") as web:
        first = web.get("/dead-letters").text
        second = web.get("/dead-letters", params={"after": ids[PAGE - 1]}).text
        gone = web.get("/dead-letters", params={"after": "no-such-letter"}).text

    row = '<tr><td class="mono">'
    assert first.count(row) == PAGE
    assert f'id="next-page" href="?after={ids[PAGE - 1]}"' in first
    assert "First page" not in first
    assert second.count(row) == 6
    assert ids[PAGE] in second
    assert "next-page" not in second
    assert '<a href="?">First page</a>' in second
    assert "100000 (truncated)" in second
    assert "no dead letter no-such-letter" in gone
    assert '<a href="?">First page</a>' in gone


def test_what_a_producer_put_in_a_dead_letter_is_listed_printable(rabbit_url: str) -> None:
    broker = Broker(rabbit_url, Topology(), scheduler=None)
    try:
        broker.declare()  # a field name of the producer's, in the schema errors
        broker.publish_dead(b"{}", "schema errors", {"\x1b[31mtitle\x07": ["Unknown"]}, WORK_KEY)
    finally:
        broker.close()
    listed = dead_letters_cli(rabbit_url, "list")
    assert listed.exit_code == 0, listed.output
    assert "\x1b" not in listed.output
    assert "\x07" not in listed.output
    assert "\\x1b[31mtitle\\x07: ['Unknown']" in listed.output
