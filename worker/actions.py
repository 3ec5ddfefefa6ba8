"""The operator's actions that the command line and the web view both take, one
function each, on explicit settings: deactivate a brand, replay or purge a dead
letter, audit upstream now (read-only). The CLI's commands and the web view's
forms call these, so both record the same events, findings and lines
(docs/operations.md, "Web view"). Re-requesting failed brands is worker/redrive.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from infrastructure.settings.model import Settings


def request_service(settings: Settings, *, read_only: bool = False) -> Any:
    """A service for the request path (no gateway call is made there) on one
    database connection at a time, opened per use. `read_only`: creates nothing."""
    from infrastructure.gateway.adapter import HttpGateway
    from infrastructure.service import ProvisioningService
    from infrastructure.store.eventstore import open_event_store

    app = open_event_store(
        settings.database_url,
        one_shot=True,
        read_only=read_only,
        wait_s=settings.connect_wait_s,
    )
    gateway = HttpGateway("http://127.0.0.1:9", "request-path")
    # As on the message path (worker/runtime.py): a text holding the token is refused.
    token = (settings.gateway_token,) if settings.gateway_token else ()
    return ProvisioningService(
        app, gateway, settings=settings.engine(acting=not read_only), secrets=token
    )


def deactivate(settings: Settings, brand_id: str, *, purge_now: bool) -> str:
    """Deactivate the brand (`Brand.Deactivated`, its pending attempt `Cancelled`);
    its workspace is emptied once the retention window ends, or at once with
    `purge_now`. What was done, as `provisioner deactivate` prints it; a
    `ProvisionerError` when it cannot be."""
    service = request_service(settings)
    try:
        result = service.deactivate(brand_id, purge_now=purge_now)
    finally:
        service.app.close()
    return deactivation_sentence(result)


@contextmanager
def dead_letters(settings: Settings, url: str | None = None) -> Iterator[Any]:
    """`provisioning.dead` on the broker (`url`, or the configured one): a broker that
    fails is one line (a `ServiceUnavailable` or `ServiceRefused`)."""
    from infrastructure.broker.dead_letters import DeadLetters
    from infrastructure.broker.failures import broker_failure
    from infrastructure.broker.topology import Topology

    url = url or settings.broker_url
    try:
        tls = settings.broker_tls()
        with DeadLetters(url, Topology(queue_type=settings.queue_type), tls=tls) as letters:
            yield letters
    except Exception as exc:
        failure = broker_failure(exc, url)
        if failure is None:
            raise
        raise failure from exc


def cut(letter: Any) -> str:
    """` (cut to N of M bytes)` for a dead letter the queue holds truncated."""
    return f" (cut to {len(letter.body)} of {letter.body_bytes} bytes)" if letter.truncated else ""


def replay_lines(done: Any) -> list[str]:
    """What a replay did (a `Replayed`), a line a letter and the count."""
    lines = [
        f"replayed {letter.id} to {letter.exchange}/{letter.routing_key}"
        for letter in done.replayed
    ]
    lines += [
        f"kept {letter.id}: its body is not whole{cut(letter)}, it cannot be replayed"
        for letter in done.kept
    ]
    kept = f"; {len(done.kept)} kept, truncated" if done.kept else ""
    return [*lines, f"{len(done.replayed)} dead letter(s) replayed{kept}"]


def purge_lines(purged: Sequence[Any]) -> list[str]:
    """What a purge by id or reason deleted, a line a letter and the count."""
    lines = [
        f"purged {letter.id} ({letter.reason}, from {letter.source_queue})" for letter in purged
    ]
    return [*lines, f"{len(purged)} dead letter(s) purged"]


@contextmanager
def audit_service(settings: Settings) -> Iterator[Any]:
    """A service on the real gateway, paced by the fleet's limiter, and one database
    connection at a time."""
    from infrastructure.failures import ConfigurationError
    from infrastructure.gateway.adapter import HttpGateway
    from infrastructure.gateway.pacing import Pace
    from infrastructure.service import ProvisioningService
    from infrastructure.store.eventstore import open_event_store
    from worker.health import metrics
    from worker.runtime import pace_store

    chosen = settings.gateway()
    if chosen is None:
        raise ConfigurationError(
            "the audit reads the real gateway: set PROVISIONER_GATEWAY_URL and its token "
            "(an in-process fake has nothing to compare)"
        )
    url, token = chosen
    app = open_event_store(settings.database_url, one_shot=True, wait_s=settings.connect_wait_s)
    pace = Pace(
        pace_store(settings, url, calls=True), settings.pace(), on_event=metrics.observe_pace
    )
    try:
        with HttpGateway(
            url,
            token,
            read_timeout=settings.gateway_timeout_s,
            pace=pace,
            ca_file=settings.gateway_ca_file,
        ) as gateway:
            yield ProvisioningService(
                app, gateway, settings=settings.engine(acting=True), secrets=(token,)
            )
    finally:
        pace.close()
        app.close()


def audit_parents(svc: Any, parent: str | None) -> list[str]:
    """The parents to audit: `parent` (refused when the service does not act under
    it), or every one an attempt on record was started under."""
    from infrastructure.failures import ConfigurationError
    from infrastructure.usecases.upstream_audit import parents_on_record

    if parent and not svc.parent_allowed(parent):
        raise ConfigurationError(
            f"--parent {parent!r} is not one of the parents this service acts under "
            "(PROVISIONER_PARENT_IDS): not audited"
        )
    return [parent] if parent else parents_on_record(svc)


def record_audits(settings: Settings, audits: Sequence[Any]) -> None:
    """Record the audits as the reconciler's are (the web view's /audit shows them)."""
    from infrastructure.views.audit_findings import FindingsWriter

    FindingsWriter(settings.database_url).write(audits)


@contextmanager
def gateway_answers() -> Iterator[None]:
    """A gateway that refused the token (`ServiceRefused`, exit 4: 1 means findings)
    or did not answer (`ServiceUnavailable`, exit 5), as one line."""
    from domain.ports import GatewayError, Unauthorized
    from infrastructure.failures import ServiceRefused, ServiceUnavailable

    try:
        yield
    except Unauthorized as exc:
        raise ServiceRefused(f"the gateway refused the token: {exc}") from None
    except GatewayError as exc:
        raise ServiceUnavailable(f"the gateway did not answer the audit: {exc}") from None


def audit_now(settings: Settings, parent: str | None = None) -> list[Any]:
    """`provisioner audit [--parent P]` without `--fix`: each parent's family in the
    gateway against the log, read only, recorded as the reconciler's audits are; the
    `Audit` of each parent."""
    from infrastructure.usecases.upstream_audit import audit_parent

    with gateway_answers(), audit_service(settings) as svc:
        audits = [audit_parent(svc, p) for p in audit_parents(svc, parent)]
    record_audits(settings, audits)
    return audits


def audit_line(audit: Any) -> str:
    """One parent's audit in a line: what is clean, and the findings."""
    clean = audit.clean
    return (
        f"parent {audit.parent_id}: {clean.get('bound_ready', 0)} bound and ready, "
        f"{clean.get('bound_settling', 0)} bound and settling, "
        f"{clean.get('released_empty', 0)} released and empty; {len(audit.problems)} findings, "
        f"{len(audit.findings) - len(audit.problems)} for information"
    )


def deactivation_sentence(result: Any) -> str:
    """What `deactivate` did (a `Deactivation`), as one or two sentences."""
    brand = result.brand_id
    at = getattr(result, "to_be_emptied_at", None)
    when = f" at {at.isoformat(timespec='seconds')}" if at else ""
    if result.already_deactivated:
        if result.workspace_id:
            return (
                f"brand {brand} was already deactivated; workspace {result.workspace_id} "
                f"is to be emptied{when}."
            )
        return f"brand {brand} was already deactivated; nothing changed."
    done = f"brand {brand} deactivated"
    if result.cancelled_attempt_id is not None:
        done += f"; its pending attempt {result.cancelled_attempt_id} was cancelled"
    else:
        done += "; no attempt was pending"
    if result.workspace_id:
        return (
            f"{done}. A worker will empty workspace {result.workspace_id}{when} and unbind "
            "it; a provision of the same title and parent before then keeps it."
        )
    return f"{done}, and it has no workspace to empty."
