"""The rules the use cases follow: `EngineSettings`, each default the setting's."""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.waits import Backoff, Deferral
from infrastructure.settings.table import default_of


def _backoff() -> Backoff:
    return Backoff(base_s=default_of("backoff_base_s"), max_requeues=default_of("max_requeues"))


def _deferral() -> Deferral:
    return Deferral(
        max_s=default_of("defer_max_s"),
        deadline_s=default_of("attempt_deadline_s"),
        retry_after_max_s=default_of("retry_after_max_s"),
    )


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The rules the use cases follow (`Settings.engine()` makes them from the
    settings in effect). Each default is the setting's (infrastructure/settings/table.py):
    a test that needs another value says so."""

    backoff: Backoff = field(default_factory=_backoff)
    # Hops the gateway did not answer: their backoff, and the attempt's deadline.
    deferral: Deferral = field(default_factory=_deferral)
    stale_after_s: float = default_of("stale_after_s")
    # How long an unconfirmed create may still turn up in the family listing;
    # until then no second create of that title is made under that parent.
    create_grace_s: float = default_of("create_grace_s")
    max_rounds: int = 6
    # The parents the service may act under (PROVISIONER_PARENT_IDS). None: any
    # (only for a service embedded in a test; the settings always give a set).
    parent_ids: frozenset[str] | None = None
    # How long after a create's grace began a new child may be credited to it by
    # inference (`domain.ownership`); after that, a new same-title child is not ours.
    inference_window_s: float = default_of("inference_window_s")
    # How far in the future a command's `requested_at` may be (clock skew).
    command_skew_s: float = default_of("command_skew_s")
    # The retention window: from a deactivation to emptying the bound workspace.
    decommission_delay_s: float = default_of("decommission_delay_s")
