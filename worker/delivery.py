"""What the hop worker does with one delivery: read it, and settle it.

Nothing a producer can put on a queue stops the worker, and no failure of one
message ends its thread:

- `Settler.read` refuses what is not a message we understand — kombu's
  `message.errors` (a compression header with junk), a content type or
  encoding we do not speak, a bad `x-retries` header, and every `decode`
  refusal (too large, too deeply nested, not UTF-8, invalid JSON, schema
  errors), and a type its queue does not accept (`messages.QUEUE_RULES`: a
  hop, release or decommission on the producers' commands queue is an
  `internal message on the commands queue`) — by dead-lettering it with the
  reason, then acking it.
- `Settler.settle` acks a handled message, dead-letters a `DeadLetter`, and
  re-publishes any other failure after a delay with `x-retries` + 1 (dead-
  lettered as `retries exhausted` after the last delay: about 200 s; a hop
  that raised a bug every time fails its attempt `internal_error` first). A
  command refused only for now (`RetryLater`: a decommission in progress)
  has its own, longer schedule and count (`x-waits`, `WAIT_DELAYS_S`: 5, 15,
  60 s, then every 120 s, about an hour in all), so only a decommission
  stuck that long dead-letters it.
- An unexpected exception while doing any of that is contained (`_contain`):
  the message is retried if it can be, else dead-lettered (`unexpected
  error`), else rejected without requeue (the queue's own dead-lettering then
  takes it), and the worker carries on. Broker connection errors alone pass
  through: the consuming loop reconnects and the broker redelivers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from domain.errors import RetryLater
from infrastructure.broker import Broker
from infrastructure.messages import InvalidMessage, Message, admit, decode, retries, waits
from infrastructure.outages import Outage, is_database_error, one_line
from infrastructure.redaction import Secrets
from worker import metrics

log = logging.getLogger("provisioner.worker")

# Retries of a command refused only for now (RetryLater), counted apart from
# infrastructure failures (`x-retries`, worker.consumer.RETRY_DELAYS_S: about
# 200 s) in `x-waits`: 5, 15, 60 s, then every 120 s; 3,560 s (about an hour)
# in all. Delays the infrastructure schedule uses too: no new wait queues.
WAIT_DELAYS_S = (5.0, 15.0, 60.0) + (120.0,) * 29


@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery that passed `read`: the message and its retry counts so far
    (infrastructure failures; refusals for now)."""

    message: Message
    tries: int
    waits: int = 0


def inspect(message: Any, queue: str) -> Delivery:
    """The message and retry counts of a delivery from `queue`; InvalidMessage when it
    has none that queue accepts."""
    if message.errors:
        exc = message.errors[0][1] if isinstance(message.errors[0], tuple) else message.errors[0]
        raise InvalidMessage("undecodable", {"kombu": one_line(exc)})
    headers = message.headers
    tries = retries(headers)
    waited = waits(headers)
    if headers and headers.get("compression") is not None:
        compression = repr(headers["compression"])[:50]
        raise InvalidMessage("unsupported encoding", {"compression": compression})
    decoded = decode(
        message.body, content_type=message.content_type, content_encoding=message.content_encoding
    )
    return Delivery(admit(queue, decoded), tries, waited)


class Settler:
    """Reads and settles deliveries on the consuming thread, through `publisher`."""

    def __init__(
        self,
        publisher: Broker,
        *,
        stats: Any,
        retry_delays_s: tuple[float, ...],
        connection_errors: tuple[type[BaseException], ...],
        database: Outage,
        dead_letter: type[Exception],
        wait_delays_s: tuple[float, ...] = WAIT_DELAYS_S,
        refused_for_now: type[Exception] | tuple[type[Exception], ...] = RetryLater,
        secrets: tuple[str, ...] = (),
        given_up: Callable[[Message, BaseException], None] | None = None,
    ) -> None:
        self.publisher = publisher
        self.stats = stats
        self.retry_delays_s = retry_delays_s
        self.connection_errors = connection_errors
        self.database = database
        self.dead_letter = dead_letter  # raised by handlers: never retried
        self.wait_delays_s = wait_delays_s
        self.refused_for_now = refused_for_now  # raised by handlers: retried on its own schedule
        # Told of a message whose retries are spent, before it is dead-lettered.
        self.given_up = given_up
        # The token as a body, a header or an error may hold it, in any form.
        self.secrets = Secrets(secrets)

    def read(self, message: Any, queue: str) -> Delivery | None:
        """The delivery (from `queue`) to hand to a handler, or None once it has been
        dead-lettered."""
        try:
            return inspect(message, queue)
        except self.connection_errors:
            raise
        except InvalidMessage as exc:
            reason, errors = exc.reason, exc.errors
        except Exception as exc:  # noqa: BLE001 - whatever a delivery holds, it is refused
            reason, errors = "undecodable", {"error": one_line(exc)}
        self._guarded(message, lambda: self.dead(message, reason, errors), None)
        return None

    def settle(self, message: Any, delivery: Delivery, future: Future[str]) -> None:
        try:
            detail = future.result()
        except Exception as exc:  # noqa: BLE001 - settled below, whatever it is
            failure = exc
        else:
            self._guarded(message, lambda: self._handled(message, delivery, detail), delivery)
            return
        if isinstance(failure, self.dead_letter):
            reason = str(getattr(failure, "reason", type(failure).__name__))
            errors = getattr(failure, "errors", None) or {}
            self._guarded(message, lambda: self.dead(message, reason, errors), delivery)
        else:  # an infrastructure failure: retry later
            self._guarded(message, lambda: self.retry(message, delivery, failure), delivery)

    def requeue(self, message: Any) -> None:
        """Hand a message not started back to the broker (for any worker)."""
        self._guarded(message, message.requeue, None)

    def _handled(self, message: Any, delivery: Delivery, detail: str) -> None:
        message.ack()
        self.database.up()
        kind = delivery.message.type
        metrics.HANDLED.labels(kind).inc()
        self.stats.handled += 1
        self.stats.by_type[kind] = self.stats.by_type.get(kind, 0) + 1
        log.debug("handled %s %s: %s", kind, delivery.message.fields, detail)

    def retry(self, message: Any, delivery: Delivery, exc: BaseException) -> None:
        if isinstance(exc, self.refused_for_now):
            self._wait(message, delivery, exc)
            return
        tries, decoded = delivery.tries, delivery.message
        if tries >= len(self.retry_delays_s):
            if self.given_up is not None:
                self.given_up(decoded, exc)
            self.dead(message, "retries exhausted", {"error": repr(exc)[:300]})
            return
        delay = self.retry_delays_s[tries]
        if is_database_error(exc):
            self.database.failed(self.database.url, exc, delay)  # logged once per outage
        else:
            log.warning("%s failed (%s); retry %d in %.0fs",
                        decoded.type, one_line(exc), tries + 1, delay)  # fmt: skip
        self._republish(message, delivery, delay, {"x-retries": tries + 1})

    def _wait(self, message: Any, delivery: Delivery, exc: BaseException) -> None:
        """A command refused only for now: re-published on the longer schedule."""
        if delivery.waits >= len(self.wait_delays_s):
            waited = sum(self.wait_delays_s)
            self.dead(message, "retries exhausted", {"error": repr(exc)[:300], "waited_s": waited})
            return
        delay = self.wait_delays_s[delivery.waits]
        log.info("%s refused for now (%s); retry in %.0fs",
                 delivery.message.type, one_line(exc), delay)  # fmt: skip
        self._republish(message, delivery, delay, {"x-waits": delivery.waits + 1})

    def _republish(
        self, message: Any, delivery: Delivery, delay: float, counts: dict[str, int]
    ) -> None:
        headers = {"x-retries": delivery.tries}
        if delivery.waits:
            headers["x-waits"] = delivery.waits
        headers.update(counts)
        self.publisher.publish(delivery.message, delay_s=delay, headers=headers)
        message.ack()
        metrics.RETRIED.inc()
        self.stats.retried += 1

    def dead(self, message: Any, reason: str, errors: dict[str, Any]) -> None:
        source = str((message.delivery_info or {}).get("routing_key", "?"))
        body = message.body
        if not isinstance(body, bytes):
            body = str(body).encode("utf-8", "backslashreplace")
        # A producer's body, a field name or type in its errors may hold the token.
        body, source = self.secrets.scrub_bytes(body), self.secrets.scrub(source)
        reason, errors = self.secrets.scrub(reason), self.secrets.scrub_value(errors)
        self.publisher.publish_dead(body, reason, errors, source)
        message.ack()
        metrics.DEAD_LETTERED.labels(reason).inc()
        self.stats.dead_lettered += 1
        log.error("dead-lettered a message from %s: %s %s", source, reason, str(errors)[:300],
                  extra={"reason": reason})  # fmt: skip

    def _guarded(self, message: Any, action: Callable[[], None], delivery: Delivery | None) -> None:
        try:
            action()
        except self.connection_errors:
            raise
        except Exception as exc:  # noqa: BLE001 - one message never stops the worker
            self._contain(message, delivery, exc)

    def _contain(self, message: Any, delivery: Delivery | None, exc: Exception) -> None:
        """Settle a message whose settling failed unexpectedly: retry it if it can be,
        else dead-letter it, else reject it (the queue dead-letters it itself)."""
        log.error("settling a message failed unexpectedly (%s)", one_line(exc))
        if _settled(message):
            return
        steps: list[Callable[[], None]] = []
        if delivery is not None and delivery.tries < len(self.retry_delays_s):
            steps.append(lambda: self.retry(message, delivery, exc))
        steps.append(lambda: self.dead(message, "unexpected error", {"error": one_line(exc)}))
        steps.append(lambda: message.reject(requeue=False))
        for step in steps:
            try:
                step()
            except self.connection_errors:
                raise
            except Exception as again:  # noqa: BLE001 - try the next way out
                log.warning("and so did its fallback (%s)", one_line(again))
                if _settled(message):
                    return
            else:
                return


def _settled(message: Any) -> bool:
    return bool(getattr(message, "acknowledged", False))
