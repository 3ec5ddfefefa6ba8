"""Errors the use cases raise for bad requests and refused commands.

Each carries a message meant for a person: what is wrong and what to do.
"""

from __future__ import annotations


class ProvisionerError(Exception):
    """Base of the errors a caller of the service is expected to handle."""


class InvalidRequest(ProvisionerError):
    """The request is malformed (empty id, empty title, ...); nothing was recorded."""


class ForeignParent(InvalidRequest):
    """The command names a parent workspace the service is not configured to act
    under (PROVISIONER_PARENT_IDS); nothing was recorded."""


class FutureCommand(InvalidRequest):
    """The command's `requested_at` is further in the future than the allowed clock
    skew: stored, it would make every later command for the brand stale."""


class UnknownBrand(ProvisionerError):
    """No brand with that id was ever registered."""


class UnknownAttempt(ProvisionerError):
    """No attempt with that id exists."""


class AttemptInProgress(ProvisionerError):
    """The brand already has a pending attempt that is not stale yet."""


class BrandDeactivated(ProvisionerError):
    """The command needs an active brand."""


class AlreadyClaimed(ProvisionerError):
    """The workspace is claimed by another brand."""


class CommandRefused(ProvisionerError):
    """A command that the aggregate's current state does not allow."""


class NotOurs(CommandRefused):
    """Ownership's verdict (`domain.ownership`) refuses to empty the workspace: a
    parent, someone else's, or credited by inference and holding projects."""


class RetryLater(ProvisionerError):
    """Refused only for now (the brand's workspace is being emptied): the same
    command succeeds once that is over, so a consumer retries it."""


class StaleCommand(ProvisionerError):
    """The command is not newer than one the brand already applied (a late or
    redelivered command). It was recorded as ignored; nothing else changed."""
