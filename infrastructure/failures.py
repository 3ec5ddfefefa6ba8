"""How the service fails at its edges, and the exit code each failure gets.

Three kinds, told apart because an operator acts on each differently:

- `ConfigurationError`: a setting or flag cannot be used (a malformed URL, an
  empty variable, a missing token). Nothing was tried; fix the setting.
- `ServiceRefused`: a service answered, and retrying cannot change its answer
  (authentication failed, the database or vhost does not exist, permission
  denied, an unsupported scheme). Long-running processes stop at once with it.
- `ServiceUnavailable`: a service did not answer, or dropped us (connection
  refused, timed out, too many clients). Long-running processes retry it with
  backoff; a one-shot command reports it and exits.

Every message names what failed (credentials redacted) and what to do.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from domain.waits import jittered

# Exit codes of the `provisioner` command (docs/configuration.md lists them).
EXIT_OK = 0
EXIT_ERROR = 1  # a clear error, or `provision --wait` ended other than promoted
EXIT_WAIT_TIMEOUT = 2  # `provision --wait` timed out (click's usage errors use 2 too)
EXIT_CONFIGURATION = 3
EXIT_REFUSED = 4
EXIT_UNAVAILABLE = 5


class EdgeFailure(Exception):
    """Base of the failures at the service's edges; `exit_code` is the CLI's."""

    exit_code = EXIT_ERROR


class ConfigurationError(EdgeFailure, ValueError):
    """A setting cannot be used; the message names the variable or flag."""

    exit_code = EXIT_CONFIGURATION


class ServiceRefused(EdgeFailure, RuntimeError):
    """A service refused us for good: retrying cannot fix it."""

    exit_code = EXIT_REFUSED


class ServiceUnavailable(EdgeFailure, RuntimeError):
    """A service is down or unreachable for now: retrying may fix it."""

    exit_code = EXIT_UNAVAILABLE


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what caused it (`__cause__`, else `__context__`), and so on:
    libraries wrap a driver's error in their own, and the driver's says why."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 15.0


class ReconnectPauses:
    """Pauses between a process's tries to reach the database or the broker again:
    FIRST_PAUSE_S doubling to MAX_PAUSE_S, each drawn between half and all of its
    nominal value (`domain.waits.jittered`)."""

    def __init__(
        self,
        first_s: float = FIRST_PAUSE_S,
        max_s: float = MAX_PAUSE_S,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.rng = rng
        self._nominal = first_s

    def next(self) -> float:
        pause = jittered(self._nominal, self.rng())
        self._nominal = min(self._nominal * 2, self.max_s)
        return pause

    def reset(self) -> None:
        self._nominal = self.first_s
