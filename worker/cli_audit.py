"""`provisioner audit`: the gateway's family of each parent against the log (the
upstream audit, `infrastructure.usecases.upstream_audit`; not the audit trail of
`provisioner history`). Exit 0 when clean, 1 on findings."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import click

from worker.cli_support import cell, compact_table, echo, jsonable, load_settings, secrets


@contextmanager
def audit_service() -> Iterator[Any]:
    """A service on the real gateway, paced by the fleet's limiter, and one database
    connection at a time."""
    from infrastructure.eventstore import open_event_store
    from infrastructure.failures import ConfigurationError
    from infrastructure.gateway import HttpGateway
    from infrastructure.pacing import Pace
    from infrastructure.service import ProvisioningService
    from worker import metrics
    from worker.runtime import pace_store

    settings = load_settings()
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
        with HttpGateway(url, token, read_timeout=settings.gateway_timeout_s, pace=pace,
                         ca_file=settings.gateway_ca_file) as gateway:  # fmt: skip
            yield ProvisioningService(
                app, gateway, settings=settings.engine(acting=True), secrets=(token,)
            )
    finally:
        pace.close()
        app.close()


def finding_json(finding: Any, done: str | None = None) -> dict[str, Any]:
    data = asdict(finding)
    data["problem"] = finding.is_problem
    data["brand_ids"] = list(finding.brand_ids)
    if done is not None:
        data["done"] = done
    return data


@click.command()
@click.option(
    "--parent", default=None, help="Audit this parent only (default: every one on record)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per finding.")
@click.option(
    "--fix", "do_fix", is_flag=True,
    help="Release orphans of ours and owed workspaces; provision again brands whose "
    "workspace is gone. Nothing else is touched.",
)  # fmt: skip
def audit(parent: str | None, as_json: bool, do_fix: bool) -> None:
    """Compare each parent's family in the gateway with the log: every workspace on
    record, every unexplained child of a title we provisioned. Exit 0 when clean,
    1 on findings (`foreign` and `in_flight` are information only), 4 or 5 when the
    gateway refused or did not answer."""
    from domain.ports import GatewayError, Unauthorized
    from infrastructure.failures import ServiceRefused, ServiceUnavailable
    from infrastructure.usecases.upstream_audit import audit_parent, fix, parents_on_record

    done: dict[int, str] = {}
    try:
        with audit_service() as svc:
            parents = [parent] if parent else parents_on_record(svc)
            audits = [audit_parent(svc, p) for p in parents]
            if do_fix:
                for result in audits:
                    done.update({id(f.finding): f.done for f in fix(svc, result)})
    except Unauthorized as exc:  # exit 4, not 1: 1 means findings
        raise ServiceRefused(f"the gateway refused the token: {exc}") from None
    except GatewayError as exc:  # exit 5: try again later
        raise ServiceUnavailable(f"the gateway did not answer the audit: {exc}") from None
    rows = [(f, done.get(id(f))) for result in audits for f in result.findings]
    if as_json:
        import json

        data = secrets().scrub_value([finding_json(f, d) for f, d in rows])
        echo(json.dumps(data, indent=2, default=jsonable))
    else:
        _table(audits, rows, do_fix)
    sys.exit(1 if any(result.problems for result in audits) else 0)


def _table(audits: list[Any], rows: list[tuple[Any, str | None]], fixed: bool) -> None:
    from rich.console import Console

    scrub = secrets().scrub
    console = Console()
    for result in audits:
        clean = result.clean
        console.print(cell(scrub(
            f"parent {result.parent_id}: {clean['bound_ready']} bound and ready, "
            f"{clean['bound_settling']} bound and settling, {clean['released_empty']} released "
            f"and empty; {len(result.problems)} findings, "
            f"{len(result.findings) - len(result.problems)} for information"
        )))  # fmt: skip
    if not rows:
        return
    table = compact_table("findings")
    table.add_column("kind", overflow="fold")
    table.add_column("workspace", overflow="fold")
    table.add_column("evidence" + (" and what was done" if fixed else ""), overflow="fold", ratio=1)
    for finding, done in rows:
        kind = finding.kind.value + ("" if finding.is_problem else " (info)")
        parts = [finding.detail]
        if finding.brand_ids:
            parts.append(f"brand {', '.join(finding.brand_ids)}")
        if finding.status is not None:
            parts.append(f"status {finding.status}")
        if finding.projects is not None:
            parts.append(f"{finding.projects} projects")
        if done:
            parts.append(f"done: {done}")
        table.add_row(cell(kind), cell(scrub(finding.workspace_id)), cell(scrub("; ".join(parts))))
    console.print(table)
