"""What `provisioning.dead` holds, read without consuming it; replay and purge.

Reading one message is infrastructure/broker/dead_letter_parsing.py.

Browsing takes the messages one at a time with `basic.get` without acking them
(as many as the queue held when it began, so a walk ends however fast letters
come in); the channel closes at the end, and RabbitMQ puts them back in their
places, so order is kept and nothing is lost, whatever happens in between. Only
the message at hand is in memory: a `DeadLetterEntry` keeps the first
`DEAD_BODY_KEPT` bytes of its body, and a listing is a `Page` of at most
`PAGE_MAX` of them (with the counts by reason of all, when asked). A message's
id is its `x-dead-id`, or for a message the queue dead-lettered, a hash of its
body and headers; a replay keeps it (infrastructure/broker/dead_letter_parsing.py).
Wherever an id is taken, so is a unique prefix of one (`resolve`: a walk of its
own; `AmbiguousId` names the matches).

`replay` re-publishes the chosen messages, their bodies as the queue holds them,
with their own content type and encoding, confirmed, to the exchange and
routing key they came from (for a letter a queue dead-lettered: that queue's
route, as RabbitMQ recorded it), their headers stripped of the dead-letter ones
but the id and its producer, as the service's user (`user_id`: the broker
vouches that the service sent it), and only then acks them in the dead queue.
Nothing else of the message is sent again: no `expiration`, no `user_id` of
its own. A truncated dead letter is
never replayed (its body is not whole): `NotReplayable` for one asked by its
id, kept and reported with every other. `purge` deletes the letters of given
ids or reasons (acking them in the walk), `purge_all` the whole queue. The
embedded broker (`memory://`) lives inside one process: another process never
sees its dead letters.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import amqp

from domain.dead_letter_rules import AmbiguousId, NoSuchId, counts_by_reason, match_id
from infrastructure.broker.connection import connect, is_memory
from infrastructure.broker.dead_letter_parsing import DeadLetterEntry, NotReplayable, Page, parse
from infrastructure.broker.publisher import Unroutable
from infrastructure.broker.topology import DEAD_QUEUE, Topology
from infrastructure.failures import ConfigurationError
from infrastructure.settings.model import BrokerTls

__all__ = [
    "PAGE",
    "PAGE_MAX",
    "DeadLetters",
    "EmbeddedBroker",
    "NotFound",
    "Replayed",
    "now",
]

EMBEDDED_NOTICE = (
    "the embedded broker (memory://) keeps dead letters only inside the process that "
    "made them: there is none to list, replay or purge from another process; "
    "set PROVISIONER_BROKER_URL to a RabbitMQ broker"
)
PAGE = 50  # dead letters a listing shows by default
PAGE_MAX = 500  # and at most: a page holds each one's headers and body prefix


class EmbeddedBroker(ConfigurationError):
    """Dead letters asked of `memory://`, which keeps none across processes."""

    def __init__(self) -> None:
        super().__init__(EMBEDDED_NOTICE)


class NotFound(NoSuchId):
    """No dead letter has this id (nor one it is a prefix of)."""


class DeadLetters:
    """`provisioning.dead` on a RabbitMQ broker (one connection, one channel)."""

    def __init__(
        self, url: str, topology: Topology | None = None, *, tls: BrokerTls | None = None
    ) -> None:
        if is_memory(url):
            raise EmbeddedBroker()
        self.connection: Any = connect(url, tls)
        self.user: str = str(self.connection.userid)  # who replays: the service's user
        self.topology = topology or Topology()
        self.channel: Any = None

    def __enter__(self) -> DeadLetters:
        self.connection.ensure_connection(max_retries=1)
        self.channel = self.connection.channel()
        self.topology.declare(self.channel)
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(Exception):
            self.connection.release()

    @contextlib.contextmanager
    def _walk(self, *, whole: bool = False) -> Iterator[tuple[Any, Iterator[_Taken]]]:
        """The messages the queue holds now, in its order, taken one at a time and held
        unacked on a channel of its own; whatever is not acked in the block goes back
        in its place when the channel closes, however the block ends. Only the message
        at hand is in memory: each is parsed, and its whole body dropped (unless
        `whole`: to replay it), before the next is taken."""
        channel = self.connection.channel()

        def taken() -> Iterator[_Taken]:
            _, count, _ = channel.queue_declare(DEAD_QUEUE, passive=True)
            for _ in range(count):  # not those that come in meanwhile: a replay's own
                item = _take(channel, whole=whole, service=self.user)
                if item is None:
                    return
                yield item

        try:
            yield channel, taken()
        finally:
            with contextlib.suppress(Exception):
                channel.close()  # the broker requeues every unacked message, in its place

    def page(self, limit: int = PAGE, after: str | None = None, *, counted: bool = False) -> Page:
        """Up to `limit` (at most `PAGE_MAX`) dead letters in queue order, from the one
        after the letter `after` (from the first with None). NotFound when no letter
        has that id (it was replayed or purged meanwhile). `counted`: walk the whole
        queue for the counts by reason of every letter (`Page.counts`)."""
        limit = max(1, min(limit, PAGE_MAX))
        letters: list[DeadLetterEntry] = []
        reasons: list[str] = []
        more = False
        with self._walk() as (_, taken):
            found = after is None
            for item in taken:
                reasons.append(item.letter.reason)
                if not found:
                    found = item.letter.id == after
                elif len(letters) == limit:
                    more = True
                    if not counted:
                        break
                else:
                    letters.append(item.letter)
        if not found:
            raise NotFound(f"no dead letter {after} in {DEAD_QUEUE}: list from the first")
        return Page(letters, more=more, counts=counts_by_reason(reasons) if counted else [])

    def each(self) -> Iterator[DeadLetterEntry]:
        """Every dead letter, in queue order, one at a time (nothing consumed)."""
        with self._walk() as (_, taken):
            for item in taken:
                yield item.letter

    def counts_by_reason(self) -> dict[str, int]:
        """How many dead letters there are by reason (for a metric or a health check)."""
        return dict(Counter(letter.reason for letter in self.each()))

    def resolve(self, wanted: str) -> str:
        """The id `wanted` names: itself, or the one id it is a prefix of. NotFound
        when none; AmbiguousId, naming them, when several."""
        with self._walk() as (_, taken):
            ids = [i.letter.id for i in taken if i.letter.id.startswith(wanted)]
        try:
            return match_id(wanted, ids)
        except AmbiguousId:
            raise
        except NoSuchId:
            raise NotFound(f"no dead letter {wanted} in {DEAD_QUEUE}") from None

    def show(self, letter_id: str) -> DeadLetterEntry:
        """The letter of this id, or of the one id it is a unique prefix of."""
        letter_id = self.resolve(letter_id)
        with self._walk() as (_, taken):
            for item in taken:
                if item.letter.id == letter_id:
                    return item.letter
        raise NotFound(f"no dead letter {letter_id} in {DEAD_QUEUE}")

    def replay(self, letter_id: str | None = None) -> Replayed:
        """Re-publish the dead letter of this id or unique prefix (or every one with
        None) where it came from, its body as the queue holds it; each is acked in the
        dead queue only once the broker confirmed its copy. A truncated one is not:
        NotReplayable when asked by its id, else kept and listed in `kept`."""
        wanted = None if letter_id is None else self.resolve(letter_id)
        done = Replayed([], [])
        with self._walk(whole=True) as (held, taken):
            for item in taken:
                letter = item.letter
                if wanted is not None and letter.id != wanted:
                    continue
                if letter.truncated:
                    if wanted is not None:
                        raise NotReplayable(letter)
                    done.kept.append(letter)
                    continue
                self._republish(letter, item.body)
                held.basic_ack(item.tag)
                done.replayed.append(letter)
        if wanted is not None and not done.replayed:
            raise NotFound(f"no dead letter {wanted} in {DEAD_QUEUE}")
        return done

    def _republish(self, letter: DeadLetterEntry, body: bytes) -> None:
        """Publish a copy, confirmed (the connection is in confirm mode) and routed."""
        returned: list[Any] = []

        def on_return(*args: Any) -> None:
            returned.append(args)

        channel = self.channel
        channel.events["basic_return"].add(on_return)
        try:
            own = {"content_type": letter.content_type, "content_encoding": letter.content_encoding}
            message = amqp.Message(
                body,
                application_headers=letter.replay_headers,
                delivery_mode=2,
                user_id=self.user,
                **{name: value for name, value in own.items() if value is not None},
            )
            channel.basic_publish(
                message, exchange=letter.exchange, routing_key=letter.routing_key, mandatory=True
            )
        finally:
            channel.events["basic_return"].discard(on_return)
        if returned:
            raise Unroutable(
                f"no queue bound for {letter.exchange or '(default)'}/{letter.routing_key}: "
                f"dead letter {letter.id} kept"
            )

    def purge(
        self, ids: tuple[str, ...] = (), reasons: tuple[str, ...] = ()
    ) -> list[DeadLetterEntry]:
        """Delete for good the dead letters of these ids (or unique prefixes: each is
        resolved first, and an unknown or ambiguous one deletes nothing) and those of
        these reasons; the letters deleted, in queue order."""
        wanted = {self.resolve(letter_id) for letter_id in ids}
        purged: list[DeadLetterEntry] = []
        with self._walk() as (held, taken):
            for item in taken:
                if item.letter.id in wanted or item.letter.reason in reasons:
                    held.basic_ack(item.tag)
                    purged.append(item.letter)
        return purged

    def purge_all(self) -> int:
        """Delete every dead letter; how many there were."""
        return int(self.channel.queue_purge(DEAD_QUEUE) or 0)


@dataclass(frozen=True, slots=True)
class _Taken:
    """A message taken from the dead queue: its delivery tag, letter, and whole body
    (when asked for)."""

    tag: int
    letter: DeadLetterEntry
    body: bytes = b""


def _take(channel: Any, *, whole: bool, service: str) -> _Taken | None:
    """The next message of the dead queue, unacked; None when there is none."""
    raw = channel.basic_get(DEAD_QUEUE, no_ack=False)
    if raw is None:
        return None
    properties = raw.properties
    headers = properties.get("application_headers") or {}
    body = raw.body if isinstance(raw.body, bytes) else str(raw.body).encode()
    letter = parse(
        body,
        headers,
        properties.get("timestamp"),
        content_type=properties.get("content_type"),
        content_encoding=properties.get("content_encoding"),
        user_id=properties.get("user_id"),
        service=service,
    )
    return _Taken(raw.delivery_tag, letter, body if whole else b"")


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay did: the letters put back, and those kept (truncated)."""

    replayed: list[DeadLetterEntry]
    kept: list[DeadLetterEntry]


def now() -> float:
    return time.time()
