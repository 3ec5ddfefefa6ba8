"""What the hop worker does with one delivery: read it, and settle it as decided.

Nothing a producer can put on a queue stops the worker, and no failure of one
message ends its thread:

- `Settler.read` dead-letters what `reading.inspect` refuses (with the reason),
  then acks it.
- `Settler.settle` applies what `retry_policy` decides of a handler's end: it
  acks a handled message, dead-letters one (a `DeadLetter`, or retries
  exhausted: a hop that raised a bug every time fails its attempt
  `internal_error` first, through `given_up`), or re-publishes it after a delay
  with its counts (`x-retries` or `x-waits`).
- `Settler.dead` is the one way to the dead-letter queue: the reason is read
  as one of `Reason` (a label none of them is `other`, kept in the errors),
  the message's content type, encoding and dead-letter id are kept (a replay
  sends them back), and the body, the source and the errors lose every
  configured secret first.
- What a message's headers say is believed only of a message the service
  published (its `user_id`, infrastructure/broker/origins.py): a producer's
  `x-dead-id` is not kept. A command's producer, as the broker vouches for
  it, goes with it through retries and into its dead letter (`x-producer`),
  so its scope applies when it is replayed.
- An unexpected exception while doing any of that is contained (`_contain`):
  the message is retried if it can be, else dead-lettered (`internal_error`),
  else rejected without requeue (the queue's own dead-lettering then
  takes it), and the worker carries on. Broker connection errors alone pass
  through: the consuming loop reconnects and the broker redelivers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from domain.dead_letter_rules import Reason, reason_of
from domain.producer_scopes import ProducerScopes, Scope
from domain.waits import RETRY_DELAYS_S, WAIT_DELAYS_S
from infrastructure.broker.dead_letter_parsing import kept_id, kept_of
from infrastructure.broker.messages import InvalidMessage, Message
from infrastructure.broker.origins import producer_header, producer_of, vouched_headers
from infrastructure.broker.publisher import Broker
from infrastructure.outages import Outage, is_database_error, one_line
from infrastructure.redaction import Secrets
from worker.health import metrics
from worker.reading import Delivery, inspect
from worker.retry_policy import (
    Ack,
    Dead,
    DeadLetter,
    Decision,
    Republish,
    RetryPolicy,
)

__all__ = [
    "Settler",
]

log = logging.getLogger("provisioner.worker")
# What a dead letter keeps of the delivery, to be replayed as it came (and of its
# headers, only those the service vouches for: `_vouched`).
KEPT_PROPERTIES = ("content_type", "content_encoding")


def subject(message: Message) -> str:
    """The message's type and whose it is: `release attempt=…`, `decommission brand=…`."""
    fields = message.fields
    keys = [k for k in ("brand_id", "attempt_id") if k in fields]
    whose = [f"{k.removesuffix('_id')}={fields[k]}" for k in keys]
    return " ".join([message.type, *whose])


class Settler:
    """Reads and settles deliveries on the consuming thread, through `publisher`."""

    def __init__(
        self,
        publisher: Broker,
        *,
        stats: Any,
        connection_errors: tuple[type[BaseException], ...],
        database: Outage,
        retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S,
        wait_delays_s: tuple[float, ...] = WAIT_DELAYS_S,
        dead_letter: type[BaseException] = DeadLetter,
        secrets: tuple[str, ...] = (),
        given_up: Callable[[Message, BaseException], None] | None = None,
        scopes: Mapping[str, Scope] | None = None,
    ) -> None:
        self.publisher = publisher
        # The service's own broker user is never scoped; memory:// (None) has no
        # producers, and no user_id to tell one by.
        self.service: str | None = getattr(publisher, "user", None)
        scoped = scopes if self.service is not None else None
        self.scopes = ProducerScopes(scoped or {}, service=self.service)
        self.stats = stats
        # What a handler's end becomes: `dead_letter`s are never retried.
        self.policy = RetryPolicy(retry_delays_s, wait_delays_s, never_retried=(dead_letter,))
        self.connection_errors = connection_errors
        self.database = database
        # Told of a hop that raised a bug on every retry, before it is dead-lettered.
        self.given_up = given_up
        # The token as a body, a header or an error may hold it, in any form.
        self.secrets = Secrets(secrets)

    def read(self, message: Any, queue: str) -> Delivery | None:
        """The delivery (from `queue`) to hand to a handler, or None once it has been
        dead-lettered."""
        try:
            return inspect(message, queue, self.scopes)
        except self.connection_errors:
            raise
        except InvalidMessage as exc:
            reason, errors = exc.reason, exc.errors
        except Exception as exc:  # noqa: BLE001 - whatever a delivery holds, it is refused
            reason, errors = Reason.UNDECODABLE, {"error": one_line(exc)}
        self._guarded(message, lambda: self.dead(message, reason, errors), None)
        return None

    def settle(self, message: Any, delivery: Delivery, future: Future[str]) -> None:
        """Apply the policy's decision for a handler that has finished."""
        failure = future.exception()
        if failure is not None and not isinstance(failure, Exception):
            raise failure  # KeyboardInterrupt, SystemExit: not the message's doing
        detail = future.result() if failure is None else ""

        def settle() -> None:
            decision = self.policy.decide(delivery.facts, failure)
            self.apply(message, delivery, decision, failure, detail)

        self._guarded(message, settle, delivery)

    def requeue(self, message: Any) -> None:
        """Hand a message not started back to the broker (for any worker)."""
        self._guarded(message, message.requeue, None)

    def apply(
        self,
        message: Any,
        delivery: Delivery,
        decision: Decision,
        failure: BaseException | None,
        detail: str = "",
    ) -> None:
        """Do what was decided: ack, re-publish, or (after giving up) dead-letter."""
        if isinstance(decision, Ack):
            self._handled(message, delivery, detail)
        elif isinstance(decision, Republish):
            assert failure is not None
            self._republish(message, delivery, decision, failure)
        elif isinstance(decision, Dead):
            if decision.give_up and self.given_up is not None:
                assert failure is not None
                self.given_up(delivery.message, failure)
            self.dead(message, decision.reason, dict(decision.errors))

    def _handled(self, message: Any, delivery: Delivery, detail: str) -> None:
        message.ack()
        self.database.up()
        kind = delivery.message.type
        metrics.HANDLED.labels(kind).inc()
        self.stats.handled += 1
        self.stats.by_type[kind] = self.stats.by_type.get(kind, 0) + 1
        log.debug("handled %s %s: %s", kind, delivery.message.fields, detail)

    def _republish(
        self, message: Any, delivery: Delivery, decision: Republish, exc: BaseException
    ) -> None:
        delay, kind = decision.delay_s, subject(delivery.message)
        if decision.waiting:
            log.info("%s refused for now (%s); retry in %.0fs", kind, one_line(exc), delay)
        elif is_database_error(exc):
            self.database.failed(self.database.url, exc, delay)  # logged once per outage
        else:
            log.warning(
                "%s failed (%s); retry %d in %.0fs",
                kind,
                one_line(exc),
                decision.headers["x-retries"],
                delay,
            )
        # A replayed message keeps its dead letter's id through retries, so it is
        # dead-lettered again under the same id; a command keeps its producer.
        headers = {**kept_id(self._vouched(message)), **self._producer(message), **decision.headers}
        self.publisher.publish(delivery.message, delay_s=delay, headers=headers)
        message.ack()
        metrics.RETRIED.inc()
        self.stats.retried += 1

    def dead(self, message: Any, label: Reason | str, errors: dict[str, Any]) -> None:
        reason = reason_of(label).value
        if reason == Reason.OTHER and str(label) != reason:
            errors = {"label": str(label)[:200], **errors}  # what it was called
        source = str((message.delivery_info or {}).get("routing_key", "?"))
        body = message.body
        if not isinstance(body, bytes):
            body = str(body).encode("utf-8", "backslashreplace")
        # A producer's body, a field name or type in its errors may hold the token.
        body, source = self.secrets.scrub_bytes(body), self.secrets.scrub(source)
        errors = self.secrets.scrub_value(errors)
        properties = (getattr(message, name, None) for name in KEPT_PROPERTIES)
        kept = {**kept_of(self._vouched(message), *properties), **self._producer(message)}
        self.publisher.publish_dead(body, reason, errors, source, kept=kept)
        message.ack()
        metrics.DEAD_LETTERED.labels(reason).inc()
        self.stats.dead_lettered += 1
        log.error(
            "dead-lettered a message from %s: %s %s",
            source,
            reason,
            str(errors)[:300],
            extra={"reason": reason},
        )

    def _vouched(self, message: Any) -> dict[str, Any]:
        """The message's headers if the service published it; else none."""
        properties = getattr(message, "properties", None)
        return vouched_headers(properties, getattr(message, "headers", None), self.service)

    def _producer(self, message: Any) -> dict[str, str]:
        """The header naming a command's producer, as the broker vouches for it."""
        properties = getattr(message, "properties", None)
        producer = producer_of(properties, getattr(message, "headers", None), self.service)
        return producer_header(producer)

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
        if delivery is not None and self.policy.can_retry(delivery.facts):
            retry = self.policy.failed(delivery.facts, exc)
            steps.append(lambda: self.apply(message, delivery, retry, exc))
        steps.append(lambda: self.dead(message, Reason.INTERNAL_ERROR, {"error": one_line(exc)}))
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
