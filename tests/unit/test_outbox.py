"""The outbox's rules, chosen by the event's class (infrastructure/broker/outbox.py): every
event the relay reads has one, and an event without one is refused by name."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from infrastructure.broker.outbox import (
    ENDED_KINDS,
    PUBLISH,
    TOPICS,
    OutboxMapper,
    UnpublishedEvent,
)

# Every event the relay must publish something for (docs/messaging.md).
MUST_PUBLISH = (
    ProvisioningAttempt.Started,
    ProvisioningAttempt.HopScheduled,
    ProvisioningAttempt.Promoted,
    ProvisioningAttempt.Failed,
    ProvisioningAttempt.Cancelled,
    ProvisioningAttempt.Superseded,
    ProvisioningAttempt.CandidateReleased,
    Brand.Deactivated,
    Brand.WorkspaceUnbound,
)


@pytest.mark.parametrize("cls", MUST_PUBLISH, ids=lambda c: c.__qualname__)
def test_every_event_the_outbox_must_publish_has_a_rule_and_is_read(cls: type) -> None:
    assert cls in PUBLISH
    assert f"{cls.__module__}:{cls.__qualname__}" in TOPICS


def test_the_relay_reads_exactly_the_events_with_a_rule() -> None:
    assert set(PUBLISH) == set(MUST_PUBLISH)
    assert len(TOPICS) == len(PUBLISH)
    assert set(ENDED_KINDS) <= set(PUBLISH)


def test_an_event_without_a_rule_is_refused_by_its_name() -> None:
    unread: Any = ProvisioningAttempt.CreateRequested.__new__(ProvisioningAttempt.CreateRequested)
    mapper = OutboxMapper(app=None)  # type: ignore[arg-type]

    with pytest.raises(UnpublishedEvent, match=r"ProvisioningAttempt\.CreateRequested"):
        mapper.map(unread)


def test_a_started_attempt_is_hop_zero_now_and_its_brand_remembered() -> None:
    attempt_id = uuid4()
    started: Any = ProvisioningAttempt.Started.__new__(ProvisioningAttempt.Started)
    object.__setattr__(started, "originator_id", attempt_id)
    object.__setattr__(started, "brand_id", "b1")
    object.__setattr__(started, "timestamp", datetime.now(UTC))
    mapper = OutboxMapper(app=None)  # type: ignore[arg-type]

    [work], events = mapper.map(started)

    assert (work.message.type, work.delay_s, events) == ("hop", 0.0, [])
    assert mapper._brand_of(attempt_id) == "b1"  # no read of the attempt
