"""The worker's handlers (worker/handlers.py): one per message type, selected by
type, each given the message's typed fields; what they raise is what the retry
policy has a rule for."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest

from domain.errors import (
    AttemptInProgress,
    BrandDeactivated,
    CommandRefused,
    InvalidRequest,
    RetryLater,
    StaleCommand,
    UnknownAttempt,
    UnknownBrand,
)
from domain.outcomes import HopOutcome, Outcome
from domain.releases import Decommissioned, DecommissionKind
from infrastructure.broker import messages
from infrastructure.usecases.commands import Deactivation
from tests.support import drive, new_service
from worker.handlers import DECOMMISSION_SAID, HANDLERS, give_up, handle
from worker.retry_policy import DeadLetter

ATTEMPT = UUID("77bd6eb6-ffa3-4f66-abfd-b4308e37ca7b")  # fixed: it names parametrized tests
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Recording:
    """A service that records the use cases it is asked to run, and raises `fails`."""

    def __init__(self, fails: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.fails = fails

    def _called(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.fails is not None:
            raise self.fails

    def run_hop(self, attempt_id: UUID, hop: int) -> HopOutcome:
        self._called("run_hop", attempt_id, hop)
        return HopOutcome(Outcome.SCHEDULED, attempt_id, "b1", hop, "provisioning")

    def release(self, attempt_id: UUID) -> tuple[str, ...]:
        self._called("release", attempt_id)
        return ("ws-1",)

    def decommission(self, brand_id: str) -> Decommissioned:
        self._called("decommission", brand_id)
        return Decommissioned(DecommissionKind.EMPTIED, brand_id, "ws-1", 2)

    def request_provisioning(
        self, brand_id: str, title: str, parent: str, requested_at: datetime | None
    ) -> UUID:
        self._called("request_provisioning", brand_id, title, parent, requested_at)
        return ATTEMPT

    def deactivate(self, brand_id: str, requested_at: datetime | None) -> Deactivation:
        self._called("deactivate", brand_id, requested_at)
        return Deactivation(brand_id, False, ATTEMPT, None)

    def fail_internal(self, attempt_id: UUID, hop: int, error: str) -> bool:
        self._called("fail_internal", attempt_id, hop, error)
        return True


@pytest.mark.parametrize(
    ("message", "call", "said"),
    [
        (messages.hop(ATTEMPT, 3), ("run_hop", (ATTEMPT, 3)), "scheduled provisioning"),
        (messages.release(ATTEMPT), ("release", (ATTEMPT,)), "released ws-1"),
        (messages.decommission("b1"), ("decommission", ("b1",)), "decommissioned (2 projects)"),
        (messages.provision("b1", "Acme", "p", AT),
         ("request_provisioning", ("b1", "Acme", "p", AT)), f"attempt {ATTEMPT} started"),
        (messages.provision("b1", "Acme", "p"),
         ("request_provisioning", ("b1", "Acme", "p", None)), f"attempt {ATTEMPT} started"),
        (messages.deactivate("b1", AT), ("deactivate", ("b1", AT)),
         f"deactivated (cancelled {ATTEMPT})"),
        (messages.deactivate("b1"), ("deactivate", ("b1", None)),
         f"deactivated (cancelled {ATTEMPT})"),
    ],
)  # fmt: skip
def test_each_type_runs_its_use_case_with_its_typed_fields(
    message: messages.Message, call: tuple[str, tuple[Any, ...]], said: str
) -> None:
    service = Recording()

    assert handle(service, messages.decode(message.encode())) == said  # type: ignore[arg-type]

    assert service.calls == [call]


def test_a_release_that_emptied_nothing_says_so() -> None:
    class NothingEmptied(Recording):
        def release(self, attempt_id: UUID) -> tuple[str, ...]:
            super().release(attempt_id)
            return ()

    said = handle(NothingEmptied(), messages.decode(messages.release(ATTEMPT).encode()))  # type: ignore[arg-type]

    assert said == "nothing emptied"


def test_every_message_type_has_a_handler_taking_its_schemas_fields() -> None:
    assert set(HANDLERS) == {kind for kind, _ in messages.SCHEMAS}
    for (kind, _), schema in messages.SCHEMAS.items():
        body = HANDLERS[kind].body
        assert body is messages.BODIES[kind]
        assert {f.name for f in dataclasses.fields(body)} == set(schema.fields), kind


@pytest.mark.parametrize(
    "refusal",
    [UnknownAttempt("no"), UnknownBrand("no"), InvalidRequest("no"), BrandDeactivated("no"),
     CommandRefused("no")],
)  # fmt: skip
def test_a_refusal_for_good_is_a_dead_letter_named_after_it(refusal: Exception) -> None:
    with pytest.raises(DeadLetter) as caught:
        handle(Recording(refusal), messages.release(ATTEMPT))  # type: ignore[arg-type]

    assert caught.value.reason == type(refusal).__name__
    assert caught.value.errors == {"error": "no"}


def test_a_stale_command_is_ignored_and_one_in_progress_not_started() -> None:
    stale = Recording(StaleCommand("older than the last"))
    busy = Recording(AttemptInProgress("pending"))

    assert handle(stale, messages.deactivate("b1")) == "ignored: older than the last"  # type: ignore[arg-type]
    assert handle(busy, messages.provision("b1", "Acme", "p")) == "not started: pending"  # type: ignore[arg-type]


def test_a_refusal_for_now_and_infrastructure_failures_propagate_to_the_policy() -> None:
    for failure in (RetryLater("later"), OSError("reset"), KeyError("bug")):
        with pytest.raises(type(failure)):
            handle(Recording(failure), messages.decommission("b1"))  # type: ignore[arg-type]


def test_a_type_without_a_handler_or_fields_that_do_not_fit_are_dead_letters() -> None:
    with pytest.raises(DeadLetter, match="unhandled type"):
        handle(Recording(), messages.Message("explode", 1, {}))  # type: ignore[arg-type]
    with pytest.raises(DeadLetter, match="schema errors"):
        handle(Recording(), messages.Message("hop", 1, {"attempt_id": ATTEMPT}))  # type: ignore[arg-type]


def test_giving_up_fails_a_hops_attempt_internal_error_and_nothing_else() -> None:
    service = Recording()

    give_up(service, messages.hop(ATTEMPT, 2), KeyError("x"))  # type: ignore[arg-type]
    give_up(service, messages.release(ATTEMPT), KeyError("x"))  # type: ignore[arg-type]

    assert service.calls == [("fail_internal", (ATTEMPT, 2, "KeyError"))]


@pytest.mark.parametrize("what", ["brand", "claim", "slot"])
def test_a_hop_naming_a_record_that_is_not_an_attempt_is_dead_lettered_unchanged(
    what: str,
) -> None:
    """A hop message whose id is a brand's, a claim's or a title slot's: refused as
    `UnknownAttempt`, and that record is left as it was."""
    from domain.ids import brand_aggregate_id
    from tests.memory_gateway import MemoryGateway

    gateway = MemoryGateway("org-p")
    service = new_service(gateway)
    attempt_id = service.request_provisioning("b1", "Acme", "org-p")
    ran = drive(service, attempt_id)  # hop 0 creates, hop 1 polls it and promotes
    assert [o.outcome for o in ran] == [Outcome.SCHEDULED, Outcome.PROMOTED]
    workspace = ran[-1].workspace_id
    assert workspace is not None
    claim = service.claim(workspace)
    assert claim is not None
    ids = {"brand": brand_aggregate_id("b1"), "claim": claim.id,
           "slot": service.slot("org-p", "Acme").id}  # fmt: skip
    before = service.app.recorder.max_notification_id()
    asked = dict(gateway.calls)

    with pytest.raises(DeadLetter) as caught:
        handle(service, messages.hop(ids[what], 0))

    assert caught.value.reason == "UnknownAttempt"
    assert "is not a provisioning attempt" in caught.value.errors["error"]
    assert service.app.recorder.max_notification_id() == before
    assert dict(gateway.calls) == asked  # the gateway asked nothing more
    assert gateway.calls["status"] == 1  # only hop 1's poll


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        (Decommissioned(DecommissionKind.EMPTIED, "b1", "ws-1", 0), "decommissioned (0 projects)"),
        (Decommissioned(DecommissionKind.NOTHING_BOUND, "b1"), "not decommissioned: nothing bound"),
        (
            Decommissioned(DecommissionKind.NOT_DUE, "b1", "ws-1", why="the brand is active again"),
            "not decommissioned yet: the brand is active again",
        ),
        (
            Decommissioned(DecommissionKind.REFUSED, "b1", "ws-1", why="HTTP 409: locked"),
            "not decommissioned, refused: HTTP 409: locked",
        ),
        (
            Decommissioned(DecommissionKind.UNBOUND_NOT_EMPTIED, "b1", "ws-1", why="no claim"),
            "unbound, not emptied: no claim",
        ),
    ],
)
def test_a_decommission_says_what_it_did_in_words_never_none_projects(
    outcome: Decommissioned, said: str
) -> None:
    class Deciding(Recording):
        def decommission(self, brand_id: str) -> Decommissioned:
            return outcome

    assert handle(Deciding(), messages.decommission("b1")) == said  # type: ignore[arg-type]


def test_every_kind_of_decommission_has_its_words() -> None:
    assert set(DECOMMISSION_SAID) == set(DecommissionKind)
