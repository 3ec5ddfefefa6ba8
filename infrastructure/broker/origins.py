"""Who published a message, as the broker vouches for it (pure: no broker).

RabbitMQ refuses a publish whose `user_id` property differs from the
connection's user, so `user_id` names the RabbitMQ user that published the
message; headers say whatever their publisher wrote. Every message the service
publishes carries its own user's `user_id` (infrastructure/broker/publisher.py,
infrastructure/broker/dead_letters.py), so a header is the service's word only on a
message whose `user_id` is the service's:

- `x-producer`: whose command it is. The service's own commands (`rollout`,
  `retry`) name the service; one it sends on (a retry, a replay) names the
  producer that first published it, or nobody when that is unknown: a
  producer's command stays that producer's, and never becomes the service's;
- `x-dead-id`: the id a replay gave a dead letter.

`service` is the service's user, None on `memory://` (no broker user: nothing
but the service publishes there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRODUCER_HEADER = "x-producer"
_MAX_USER = 200


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def publisher_of(properties: object) -> str | None:
    """The `user_id` a message carries (None when it has none)."""
    user = properties.get("user_id") if isinstance(properties, Mapping) else None
    return _text(user)[:_MAX_USER] if user else None


def from_service(properties: object, service: str | None) -> bool:
    """The service published this message (its `user_id` is the service's user)."""
    return publisher_of(properties) == service


def vouched_headers(properties: object, headers: object, service: str | None) -> dict[str, Any]:
    """The headers of a message the service published; none of anyone else's."""
    if not isinstance(headers, Mapping) or not from_service(properties, service):
        return {}
    return dict(headers)


def producer_of(properties: object, headers: object, service: str | None) -> str | None:
    """Whose command this is: on one the service published, the producer it names in
    `x-producer`; on anyone else's, the user that published it (None when unknown)."""
    if not from_service(properties, service):
        return publisher_of(properties)
    named = vouched_headers(properties, headers, service).get(PRODUCER_HEADER)
    return _text(named)[:_MAX_USER] if named else None


def producer_header(producer: str | None) -> dict[str, str]:
    """The header naming a command's producer, when it is known."""
    return {PRODUCER_HEADER: producer} if producer else {}
