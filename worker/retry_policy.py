"""What becomes of a delivery once its handler has run: a pure decision.

`decide(facts, failure)` maps what is known of the delivery (its type, its
`x-retries` and `x-waits` counts) and how its handler ended (None: it
returned) to one of:

- `Ack`: handled.
- `Dead(reason, errors)`: to the dead-letter queue, the reason one of
  `Reason` (domain/dead_letter_rules.py). A `DeadLetter` raised by a handler
  (never retried), or a failure whose schedule is spent (`retries_exhausted`).
  A hop that raised a bug (`is_bug`) on every retry is also `give_up`: its
  attempt is failed `internal_error` before the message goes.
- `Republish(delay_s, headers)`: re-published after the delay with the counts
  in `headers`. An infrastructure failure (database down, too much contention,
  a bug that may pass) counts in `x-retries` on `retry_delays_s` (about 200 s);
  a command refused only for now (`RetryLater`: a decommission in progress) or
  a release the gateway did not answer (`TransientGatewayError`) waits on its
  own, longer schedule and count (`x-waits`, `WAIT_DELAYS_S`), so the one never
  spends the other. A refusal that says when to try again (the gateway's or the
  fleet pace's Retry-After) waits that long instead, within the schedule's first
  and longest steps; it is dead-lettered once its waits add up to the whole
  schedule (`x-waited-ms`: about an hour), however many they were.

The schedules, and how long each wait lasts, are domain/waits.py's (its words:
throttled, unanswered, refused for now, paced); here is only which one applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.dead_letter_rules import Reason, reason_of
from domain.ports import GatewayError
from domain.waits import (
    REFUSED_FOR_NOW,
    RETRY_DELAYS_S,
    TOLD_DELAYS_S,
    WAIT_DELAYS_S,
    release_wait_s,
    retry_delay_s,
    waited_s,
    waits_spent,
)
from infrastructure.broker.messages import MAX_RETRIES_HEADER
from infrastructure.outages import is_database_error
from infrastructure.usecases.retry import ContentionError


class DeadLetter(Exception):
    """A message that can never succeed; it goes to the dead-letter queue. `reason`:
    one of `Reason`, or a label `reason_of` reads as one (a refusal's name)."""

    def __init__(self, reason: Reason | str, errors: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.errors = errors or {}


def is_bug(exc: BaseException) -> bool:
    """Not the database, not the gateway, not contention: an unexpected exception."""
    return not (is_database_error(exc) or isinstance(exc, GatewayError | ContentionError | OSError))


@dataclass(frozen=True, slots=True)
class DeliveryFacts:
    """What a delivery says of itself: its type and its retry counts so far."""

    type: str
    tries: int = 0  # x-retries: infrastructure failures
    waits: int = 0  # x-waits: refusals for now
    waited_ms: int = 0  # x-waited-ms: how long they waited in all (0: not recorded)


@dataclass(frozen=True, slots=True)
class Ack:
    """Handled: acknowledge it."""


@dataclass(frozen=True, slots=True)
class Republish:
    """Publish it again after `delay_s` with `headers` (its counts), then ack it."""

    delay_s: float
    headers: Mapping[str, int]
    waiting: bool = False  # refused for now (x-waits), not failed (x-retries)


@dataclass(frozen=True, slots=True)
class Dead:
    """Dead-letter it with `reason` and `errors`, then ack it."""

    reason: Reason
    errors: Mapping[str, Any] = field(default_factory=dict)
    give_up: bool = False  # a hop that raised a bug every time: fail its attempt first


Decision = Ack | Republish | Dead


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The two schedules, and which failures wait rather than fail."""

    retry_delays_s: tuple[float, ...] = RETRY_DELAYS_S
    wait_delays_s: tuple[float, ...] = WAIT_DELAYS_S
    told_delays_s: tuple[float, ...] = TOLD_DELAYS_S
    refused_for_now: tuple[type[BaseException], ...] = REFUSED_FOR_NOW
    never_retried: tuple[type[BaseException], ...] = (DeadLetter,)

    def decide(self, facts: DeliveryFacts, failure: BaseException | None) -> Decision:
        """What to do with a delivery whose handler returned (None) or raised `failure`."""
        if failure is None:
            return Ack()
        if isinstance(failure, self.never_retried):
            label = str(getattr(failure, "reason", type(failure).__name__))
            errors = dict(getattr(failure, "errors", None) or {})
            reason = reason_of(label)
            if reason is Reason.OTHER:
                errors = {"label": label[:200], **errors}
            return Dead(reason, errors)
        return self.failed(facts, failure)

    def failed(self, facts: DeliveryFacts, exc: BaseException) -> Republish | Dead:
        """A failure that may pass: re-published on its schedule, or dead once it is spent."""
        if isinstance(exc, self.refused_for_now):
            return self._wait(facts, exc)
        delay = retry_delay_s(facts.tries, self.retry_delays_s)
        if delay is None:
            give_up = facts.type == "hop" and is_bug(exc)
            errors = {"error": repr(exc)[:300]}
            return Dead(Reason.RETRIES_EXHAUSTED, errors, give_up=give_up)
        return Republish(delay, _counts(facts, **{"x-retries": facts.tries + 1}))

    def can_retry(self, facts: DeliveryFacts) -> bool:
        """Whether an infrastructure failure of this delivery would be retried."""
        return retry_delay_s(facts.tries, self.retry_delays_s) is not None

    def _wait(self, facts: DeliveryFacts, exc: BaseException) -> Republish | Dead:
        """Refused for now: how long is domain/waits.py's (`release_wait_s`)."""
        schedule = self.wait_delays_s
        waited = waited_s(facts.waits, facts.waited_ms, schedule)
        spent = waits_spent(waited, schedule) or facts.waits >= MAX_RETRIES_HEADER  # its bound
        if spent:
            errors = {"error": repr(exc)[:300], "waited_s": waited}
            return Dead(Reason.RETRIES_EXHAUSTED, errors)
        hint = float(getattr(exc, "retry_after_s", 0.0) or 0.0)
        paced = bool(getattr(exc, "paced", False))
        delay = release_wait_s(facts.waits, hint, paced, schedule, self.told_delays_s)
        counts = {"x-waits": facts.waits + 1, "x-waited-ms": round((waited + delay) * 1000)}
        return Republish(delay, _counts(facts, **counts), waiting=True)


DEFAULT = RetryPolicy()


def decide(
    facts: DeliveryFacts, failure: BaseException | None, policy: RetryPolicy = DEFAULT
) -> Decision:
    """`policy.decide`: the worker's decision for a delivery (see the module's text)."""
    return policy.decide(facts, failure)


def _counts(facts: DeliveryFacts, **counts: int) -> dict[str, int]:
    """The delivery's counts as headers (x-waits only once there is one), updated."""
    headers = {"x-retries": facts.tries}
    if facts.waits:
        headers["x-waits"] = facts.waits
    if facts.waited_ms:
        headers["x-waited-ms"] = facts.waited_ms
    headers.update(counts)
    return headers
