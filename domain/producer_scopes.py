"""Which brands a producer may command (pure: no broker).

A producer is the RabbitMQ user that published a command, as the broker vouches
for it (`user_id`, infrastructure/broker/origins.py). An operator may scope each
producer to brand-id patterns (`ord-*`, shell-style) and, for a `provision`, to
parents (PROVISIONER_PRODUCER_SCOPES). A `deactivate` names no parent, so its
brand alone decides: a scope always lists brand patterns.

With no scope configured every producer may command every brand, as before.
With one, a command is refused unless its producer is the service itself or
has a scope that covers it: an unlisted producer, and a command with no
producer, are refused too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase


@dataclass(frozen=True, slots=True)
class Scope:
    """The brands a producer may command, and the parents it may provision under
    (any configured parent when none)."""

    brands: tuple[str, ...]
    parents: tuple[str, ...] = ()

    def covers(self, brand_id: str, parent: str | None) -> bool:
        if not any(fnmatchcase(brand_id, pattern) for pattern in self.brands):
            return False
        return parent is None or not self.parents or parent in self.parents


@dataclass(frozen=True, slots=True)
class ProducerScopes:
    """Each scoped producer's scope; `service` is the service's own user, which is
    never scoped (its `rollout`, `retry` and replays publish commands too)."""

    scopes: Mapping[str, Scope] = field(default_factory=dict)
    service: str | None = None

    def refusal(self, producer: str | None, brand_id: str, parent: str | None) -> str | None:
        """Why `producer` may not command `brand_id` (under `parent`, for a provision);
        None when it may."""
        if not self.scopes or (producer is not None and producer == self.service):
            return None
        if producer is None:
            return "the command names no producer (user_id), and producers are scoped"
        scope = self.scopes.get(producer)
        if scope is None:
            return f"producer {producer!r} has no scope"
        if scope.covers(brand_id, parent):
            return None
        under = "" if parent is None else f" under parent {parent!r}"
        return f"producer {producer!r} may not command brand {brand_id!r}{under}"
