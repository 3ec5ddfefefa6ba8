"""The request path: provision and deactivate a brand (fast, no gateway calls).

Both are ordered by `requested_at` (the producer's time; default: now): a
command older than the last one the brand applied, a redelivery of it, or the
loser of a tie with it (a deactivate wins a tie) is recorded as ignored and
raises `StaleCommand`; a newer provision for another title or parent supersedes
the pending attempt; a provision while the brand's workspace is being emptied,
or while a deactivated brand is still bound under another parent, raises
`RetryLater` (nothing recorded). A provision under a parent the service is not
configured for (`ForeignParent`) and a `requested_at` beyond the allowed clock
skew (`FutureCommand`) are refused before anything is read or recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from eventsourcing.domain import Aggregate

from domain.attempt import ProvisioningAttempt
from domain.boundaries import check_command_time, check_parent
from domain.brand import DEACTIVATE, PROVISION, Brand
from domain.errors import (
    AttemptInProgress,
    InvalidRequest,
    StaleCommand,
    UnknownBrand,
)
from domain.ids import brand_aggregate_id
from domain.policies import AttemptState
from infrastructure.usecases.reads import ServiceReads, is_unicode_text
from infrastructure.usecases.retry import retry_on_conflict

log = logging.getLogger("provisioner.engine")

MAX_ID_CHARS = 200


@dataclass(frozen=True, slots=True)
class Deactivation:
    brand_id: str
    already_deactivated: bool
    cancelled_attempt_id: UUID | None
    workspace_id: str | None
    to_be_emptied_at: datetime | None = None  # the bound workspace's, if one is bound


def _require_text(name: str, value: object, secrets: tuple[str, ...] = ()) -> str:
    """`value`, checked; a text holding one of `secrets` (the gateway token) is refused
    without echoing it, so it is never stored in an event or logged."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{name} must be a non-empty string")
    if any(secret and secret in value for secret in secrets):
        raise InvalidRequest(f"{name} contains the gateway token: refused, not stored")
    if value != value.strip() or any(ord(c) < 32 for c in value):
        raise InvalidRequest(f"{name} must not have surrounding spaces or control characters")
    if not is_unicode_text(value):  # a lone surrogate (JSON may escape one): no store holds it
        raise InvalidRequest(f"{name} must be Unicode text (it holds a lone surrogate)")
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{name} must be at most {MAX_ID_CHARS} characters")
    return value


def _require_time(svc: ServiceReads, requested_at: datetime | None) -> None:
    check_command_time(requested_at, svc.clock.now(), svc.settings.command_skew_s)


def _require_parent(svc: ServiceReads, parent_workspace_id: str) -> None:
    check_parent(parent_workspace_id, svc.settings.parent_ids)


def _brand_contended(brand_id: str) -> str:
    return f"brand {brand_id} is being changed concurrently; retry"


def request_provisioning(
    svc: ServiceReads,
    brand_id: str,
    title: str,
    parent_workspace_id: str,
    requested_at: datetime | None = None,
) -> UUID:
    """Begin an attempt for the brand; registers or reactivates the brand as needed.

    A pending attempt for another title or parent is superseded; one for the
    same title and parent serves the request (AttemptInProgress, the time
    noted). Raises StaleCommand (after recording it) if the command is stale
    (see `Brand.stale_because`), RetryLater while its workspace is being
    emptied or a deactivated brand is still bound under another parent.
    """
    _require_text("brand_id", brand_id, svc.secrets)
    _require_text("title", title, svc.secrets)
    _require_text("parent_workspace_id", parent_workspace_id, svc.secrets)
    _require_parent(svc, parent_workspace_id)
    _require_time(svc, requested_at)
    return retry_on_conflict(
        svc.settings.max_rounds,
        lambda: _begin_attempt(svc, brand_id, title, parent_workspace_id, requested_at),
        _brand_contended(brand_id),
        lambda: log.info("request raced another writer; deciding again brand=%s", brand_id),
    )


def _begin_attempt(
    svc: ServiceReads,
    brand_id: str,
    title: str,
    parent_workspace_id: str,
    requested_at: datetime | None,
) -> UUID:
    try:
        brand = svc.brand(brand_id)
    except UnknownBrand:
        brand = Brand.register(brand_id, title, parent_workspace_id)
    at = brand.command_time(requested_at, svc.clock.now())
    _refuse_if_stale(svc, brand, PROVISION, at, title=title, parent=parent_workspace_id)
    brand.check_provision_possible(parent_workspace_id)
    if not brand.is_active:
        brand.reactivate()
    touched: list[Aggregate] = [brand]
    old = svc.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
    if old is not None and not old.is_terminal:
        served = (old.title, old.parent_workspace_id) == (title, parent_workspace_id)
        if served and not old.is_stale(svc.clock.now(), svc.settings.stale_after_s):
            brand.note_provision(old.id, at)  # the pending attempt serves it
            svc.app.save(brand)
            retry_at = old.modified_on + timedelta(seconds=svc.settings.stale_after_s)
            raise AttemptInProgress(
                f"brand {brand_id} already has attempt {old.id} pending (hop "
                f"{old.expected_hop}) for this title and parent; wait for it, or retry "
                f"after {retry_at.isoformat(timespec='seconds')} when it counts as stale"
            )
        # Another title or parent (the newer command wins), or a stale attempt:
        # superseded in the same save; what it created is released after it.
        touched.append(old)
    same_parent = parent_workspace_id == brand.parent_workspace_id
    new = ProvisioningAttempt.start(
        brand_id=brand_id,
        title=title,
        parent_workspace_id=parent_workspace_id,
        existing_workspace_id=brand.workspace_id if same_parent else None,
        max_hop=svc.settings.backoff.max_requeues,
    )
    if old is not None and not old.is_terminal:
        old.supersede(new.id)
    brand.begin_attempt(new.id, title, parent_workspace_id, at)
    svc.app.save(*touched, new)
    svc.remember(new)
    log.info(
        "attempt started brand=%s attempt=%s superseded=%s",
        brand_id,
        new.id,
        old.id if old is not None and old.state is AttemptState.SUPERSEDED else None,
    )
    return new.id


def _refuse_if_stale(
    svc: ServiceReads,
    brand: Brand,
    command: str,
    at: datetime,
    *,
    title: str = "",
    parent: str = "",
) -> None:
    """Record a stale command on the brand and raise StaleCommand; else nothing."""
    reason = brand.ignore_if_stale(command, at, title, parent)
    if reason is None:
        return
    svc.app.save(brand)  # IntegrityError: the caller decides again
    log.info("stale command ignored brand=%s command=%s: %s", brand.brand_id, command, reason)
    raise StaleCommand(f"brand {brand.brand_id}: {reason}; ignored")


def deactivate(
    svc: ServiceReads,
    brand_id: str,
    requested_at: datetime | None = None,
    *,
    purge_now: bool = False,
) -> Deactivation:
    """Record the deactivation and cancel a pending attempt, in one save.

    A bound workspace is to be emptied `decommission_delay_s` from now (the
    retention window; `purge_now`: at once, also for a brand already
    deactivated); a provision of the brand before then keeps it. A brand never
    seen is recorded as deactivated (a tombstone). Raises
    StaleCommand (after recording it) if the command is stale (older than the
    last command applied, or a redelivery of it; a deactivate at the same time
    as a provision wins the tie and applies).
    """
    _require_text("brand_id", brand_id, svc.secrets)
    _require_time(svc, requested_at)
    return retry_on_conflict(
        svc.settings.max_rounds,
        lambda: _deactivate(svc, brand_id, requested_at, purge_now),
        _brand_contended(brand_id),
    )


def _deactivate(
    svc: ServiceReads, brand_id: str, requested_at: datetime | None, purge_now: bool
) -> Deactivation:
    (found,) = svc.load(brand_aggregate_id(brand_id))
    if found is None:
        tomb = Brand.tombstone(brand_id, requested_at or svc.clock.now())
        svc.app.save(tomb)
        log.info("unknown brand recorded as deactivated brand=%s", brand_id)
        return Deactivation(brand_id, False, None, None)
    brand = svc.as_brand(found, brand_id)
    at = brand.command_time(requested_at, svc.clock.now())
    _refuse_if_stale(svc, brand, DEACTIVATE, at)
    already = not brand.is_active
    now = svc.clock.now()
    brand.deactivate(
        at, now if purge_now else now + timedelta(seconds=svc.settings.decommission_delay_s)
    )
    touched: list[Aggregate] = [brand]
    cancelled: UUID | None = None
    if not already and brand.current_attempt_id is not None:
        current = svc.attempt(brand.current_attempt_id)
        if not current.is_terminal:
            current.cancel("brand deactivated")
            touched.append(current)
            cancelled = current.id
    svc.app.save(*touched)
    emptied_at = brand.to_be_emptied_at
    log.info(
        "brand deactivated brand=%s cancelled=%s to_be_emptied_at=%s",
        brand_id,
        cancelled,
        emptied_at.isoformat() if emptied_at else None,
    )
    return Deactivation(brand_id, already, cancelled, brand.workspace_id, emptied_at)
