"""`provisioner audit`: the gateway's family of each parent against the log (the
upstream audit, `infrastructure.usecases.upstream_audit`; not the audit trail of
`provisioner history`). Exit 0 when clean, 1 on findings."""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Any

import click

from worker.console import cell, compact_table, echo, jsonable, load_settings, secrets


def audit_service() -> Any:
    """A service on the real gateway, paced by the fleet's limiter, and one database
    connection at a time (worker/actions.py, shared with the web view)."""
    from worker.actions import audit_service as on_settings

    return on_settings(load_settings())


def finding_json(finding: Any, done: str | None = None) -> dict[str, Any]:
    data = asdict(finding)
    data["problem"] = finding.is_problem
    data["brand_ids"] = list(finding.brand_ids)
    data["advice"] = finding.advice
    if done is not None:
        data["done"] = done
    return data


PLAN_FORMAT = "provisioner-audit-plan/1"


def _read_plan(path: str) -> list[Any]:
    """The steps of a plan file a previous `audit --fix --plan FILE` wrote."""
    import json

    from domain.upstream_audit import PlanStep
    from infrastructure.failures import ConfigurationError

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        ours = isinstance(data, dict) and data.get("format") == PLAN_FORMAT
        steps = (
            [PlanStep(**{**step, "brand_ids": tuple(step["brand_ids"])}) for step in data["steps"]]
            if ours
            else None
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigurationError(f"--apply {path}: cannot use this plan: {exc}") from None
    if steps is None:
        raise ConfigurationError(f"--apply {path}: not a plan `audit --fix --plan` wrote")
    return steps


def _write_plan(path: str, steps: list[Any]) -> None:
    import json

    data = {"format": PLAN_FORMAT, "steps": [asdict(step) for step in steps]}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")


@click.command()
@click.option(
    "--parent", default=None, help="Audit this parent only (default: every one on record)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per finding.")
@click.option(
    "--fix",
    "do_fix",
    is_flag=True,
    help="Plan what would be fixed: release orphans of ours and owed workspaces; provision "
    "again brands whose workspace is gone. Nothing is done without --yes (or --apply).",
)
@click.option("--yes", is_flag=True, help="With --fix: do what the plan says, now.")
@click.option(
    "--plan",
    "plan_file",
    default=None,
    metavar="FILE",
    help="With --fix: write the plan to FILE, to read, then to --apply.",
)
@click.option(
    "--apply",
    "apply_file",
    default=None,
    metavar="FILE",
    help="Do what the plan in FILE says, each step only if the audit finds it still true.",
)
def audit(
    parent: str | None,
    as_json: bool,
    *,
    do_fix: bool,
    yes: bool,
    plan_file: str | None,
    apply_file: str | None,
) -> None:
    """Compare each parent's family in the gateway with the log: every workspace on
    record, every unexplained child of a title we provisioned. Exit 0 when clean,
    1 on findings (`foreign`, `adoptable` and `in_flight` are information only), 3 for
    a parent the service does not act under, 4 or 5 when the gateway refused or did
    not answer. `--fix` prints a plan (each workspace, its title, brand, projects and
    why it is ours) and acts only with `--yes`, or later with `--apply FILE`."""
    from domain.upstream_audit import plan, still_true
    from infrastructure.failures import ConfigurationError
    from infrastructure.usecases.upstream_audit import audit_parent, fix
    from worker.actions import audit_parents, gateway_answers, record_audits

    if (yes or plan_file) and not do_fix:
        raise ConfigurationError("--yes and --plan go with --fix")
    if apply_file and (do_fix or yes):
        raise ConfigurationError("--apply FILE acts on that plan: give it without --fix/--yes")
    steps = _read_plan(apply_file) if apply_file else None
    done: dict[int, str] = {}
    settings = load_settings()
    with gateway_answers(), audit_service() as svc:
        if steps is not None:
            parents = sorted({step.parent_id for step in steps})
        else:
            parents = audit_parents(svc, parent)
        audits = [audit_parent(svc, p) for p in parents]
        planned = plan(audits) if steps is None else steps
        act = still_true(planned, audits) if (yes or steps is not None) else ()
        for result in act:
            done.update({id(f.finding): f.done for f in fix(svc, result)})
        # Recorded like the reconciler's audit (the web view's /audit): as it stands
        # after what was done.
        after = [audit_parent(svc, a.parent_id) for a in audits] if done else audits
        record_audits(settings, after)
    if plan_file:
        _write_plan(plan_file, planned)
    rows = [(f, done.get(id(f))) for result in audits for f in result.findings]
    stale = _stale(planned, audits) if steps is not None else []
    if as_json:
        import json

        data = [finding_json(f, d) for f, d in rows]
        data += [{**asdict(step), "done": "skipped: no longer true"} for step in stale]
        echo(json.dumps(secrets().scrub_value(data), indent=2, default=jsonable))
    else:
        _table(audits, rows, bool(done) or steps is not None)
        _plan_text(
            planned,
            stale,
            acted=bool(yes or steps is not None),
            plan_file=plan_file,
            asked=do_fix or steps is not None,
        )
    sys.exit(1 if any(result.problems for result in audits) else 0)


def _stale(steps: list[Any], audits: list[Any]) -> list[Any]:
    """The planned steps the audit no longer finds as planned."""
    from domain.upstream_audit import PlanStep

    now = {PlanStep.of(f).key for a in audits for f in a.findings}
    return [step for step in steps if step.key not in now]


def _plan_text(
    steps: list[Any], stale: list[Any], *, acted: bool, plan_file: str | None, asked: bool
) -> None:
    if not asked:
        return
    scrub = secrets().scrub
    if not steps:
        echo("plan: nothing to fix")
        return
    echo(f"plan: {len(steps)} steps" + ("" if acted else " (nothing done)"))
    for step in steps:
        brands = ", ".join(step.brand_ids) or "-"
        projects = "?" if step.projects is None else str(step.projects)
        echo(
            scrub(
                f"  {step.action} {step.workspace_id} title {step.title!r} brand {brands} "
                f"({step.kind}, {projects} projects): {step.why}"
            )
        )
    for step in stale:
        echo(scrub(f"  skipped {step.workspace_id}: no longer as planned"))
    if not acted:
        where = f" --apply {plan_file}" if plan_file else " --fix --yes"
        echo(f"to do it: provisioner audit{where}")


def _table(audits: list[Any], rows: list[tuple[Any, str | None]], fixed: bool) -> None:
    from rich.console import Console

    from worker.actions import audit_line

    scrub = secrets().scrub
    console = Console()
    for result in audits:
        console.print(cell(scrub(audit_line(result))))
    if not rows:
        return
    table = compact_table("findings")
    table.add_column("kind", overflow="fold")
    table.add_column("workspace", overflow="fold")
    table.add_column("title", overflow="fold")
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
        if finding.advice and finding.is_problem:
            parts.append(f"to do: {finding.advice}")
        title = cell(scrub(finding.title or ""))
        table.add_row(
            cell(kind), cell(scrub(finding.workspace_id)), title, cell(scrub("; ".join(parts)))
        )
    console.print(table)
