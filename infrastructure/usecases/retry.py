"""One rule for every use case: a writer that loses a race decides again.

`Application.save` is version-checked: a writer whose aggregates changed since
it read them gets `IntegrityError`, and nothing of its save is recorded. The
use case then reads afresh and decides again, at most `rounds` times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from eventsourcing.persistence import IntegrityError

log = logging.getLogger("provisioner.engine")

T = TypeVar("T")


class ContentionError(RuntimeError):
    """Too many concurrent writers on one aggregate; retry the step later."""


def retry_on_conflict(
    rounds: int,
    step: Callable[[], T],
    contended: str,
    on_conflict: Callable[[], None] | None = None,
) -> T:
    """`step()`, run again after each version conflict; ContentionError(`contended`)
    after `rounds` conflicts. `on_conflict` forgets what the lost round read."""
    for _ in range(rounds):
        try:
            return step()
        except IntegrityError:
            if on_conflict is not None:
                on_conflict()
    raise ContentionError(contended)
