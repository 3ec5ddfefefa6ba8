"""What a failure talking to RabbitMQ means, told apart in one place.

`broker_failure` says when the broker refused us for good (403 ACCESS_REFUSED:
credentials or permissions; 530 NOT_ALLOWED: no such vhost, or no access to
it; 406 PRECONDITION_FAILED "inequivalent arg": a queue exists with other
arguments, such as another queue type; other 406s stay recoverable), which
long-running processes raise as `ServiceRefused` instead of retrying, and when
it is unreachable or dropped us (`ServiceUnavailable`), which they ride out
with backoff (infrastructure/outages.py) and one-shot commands report.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import amqp
from kombu.exceptions import OperationalError

from infrastructure.failures import EdgeFailure, ServiceRefused, ServiceUnavailable, causes
from infrastructure.redaction import redact
from infrastructure.tls import certificate_refusal

# AMQP reply codes retrying cannot change, and what to do about each.
_REFUSED = {
    403: "check the user and password (and the user's permissions) in PROVISIONER_BROKER_URL",
    530: "create the vhost and grant the user access to it, or fix PROVISIONER_BROKER_URL",
}
# A 406 PRECONDITION_FAILED is refused for good only when a declaration disagrees
# with what exists ("inequivalent arg"); other 406s (an unknown delivery tag on a
# stale channel) are the channel's, and a new channel recovers from them.
_INEQUIVALENT = (
    "a queue or exchange exists with other arguments than this process declares "
    "(PROVISIONER_QUEUE_TYPE?): set PROVISIONER_QUEUE_TYPE to match the existing queues, "
    "or delete and redeclare them (`provisioner broker init`) once they are drained"
)
# What an unreachable broker, or one that drops us, raises (besides OSError).
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    OperationalError,
    amqp.exceptions.AMQPError,
    amqp.exceptions.RecoverableConnectionError,
)


def broker_failure(exc: BaseException, url: str) -> EdgeFailure | None:
    """What a failure talking to the broker at `url` means: ServiceRefused when it
    refused us for good (see _REFUSED), ServiceUnavailable when it is unreachable
    or dropped us, None when it is no broker failure at all. A certificate that does
    not verify is refused (infrastructure/tls.py)."""
    if is_broker_error(exc):  # not an httpx error whose cause is a certificate
        tls = certificate_refusal(
            exc,
            peer=f"RabbitMQ at {redact(url)}",
            host=urlsplit(url).hostname,
            url_key="PROVISIONER_BROKER_URL",
            ca_key="PROVISIONER_BROKER_CA_FILE",
        )
        if tls is not None:
            return tls
    for cause in causes(exc):
        if not isinstance(cause, amqp.exceptions.AMQPError):
            continue
        text = " ".join(str(getattr(cause, "reply_text", "") or cause).split())[:200]
        todo = _REFUSED.get(cause.code)
        if cause.code == 406 and "inequivalent arg" in text:
            todo = _INEQUIVALENT
        if todo is not None:
            return ServiceRefused(
                f"RabbitMQ at {redact(url)} refused us ({cause.code} {text}): {todo}"
            )
    if is_broker_error(exc):
        text = " ".join(str(exc).split())[:200]
        return ServiceUnavailable(
            f"RabbitMQ at {redact(url)} is unavailable ({type(exc).__name__}: {text}): check "
            "that it is running and reachable"
        )
    return None


def broker_refusal(exc: BaseException, url: str) -> ServiceRefused | None:
    """ServiceRefused when the broker refused us for good, else None."""
    failure = broker_failure(exc, url)
    return failure if isinstance(failure, ServiceRefused) else None


def is_broker_error(exc: BaseException) -> bool:
    """True when `exc` is the broker (or the network to it) failing us."""
    return isinstance(exc, BROKER_ERRORS)
