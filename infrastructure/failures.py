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
