"""`provisioner demo`: the engine on the embedded default, with faults, in under a minute.

SQLite file, the fake gateway in-process over real HTTP, hops driven by the
in-process engine with the backoff schedule compressed 50 times. Some brands
settle slowly, one create times out after creating, one create leaves a zombie
stub, one fails terminally, one brand adopts a workspace that already exists,
and one brand is deactivated mid-flight.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from domain.attempt import ProvisioningAttempt
from domain.outcomes import HopOutcome, Outcome
from infrastructure.eventstore import open_event_store, persistence_env
from infrastructure.fake_gateway import FakeConfig, FakeGateway
from infrastructure.gateway import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings import Settings
from worker.inprocess import InProcessEngine

PARENT = "org-demo"
TIME_SCALE = 0.02  # 155 s of backoff pass in about 3 s
# brand number -> the fake's scripted fate for its title
FATES = {
    2: "slow:2",
    3: "slow:3",
    5: "timeout_after_create",
    7: "zombie",
    9: "creation_failed",
    11: "slow:4",
    13: "slow:5",  # deactivated after its first hop
    17: "slow:1",
}
DEACTIVATED = 13
ADOPTS = 15  # a ready, empty workspace with its title already exists upstream
STORIES = (5, 7)  # whose histories are printed at the end


def _title(n: int) -> str:
    return f"Demo Brand {n:02d}"


def _fresh_sqlite(url: str) -> None:
    path = persistence_env(url).get("SQLITE_DBNAME", "")
    if path and path != ":memory:":
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)


def run_demo(*, brands: int, seed: int, database_url: str) -> int:
    console = Console()
    _fresh_sqlite(database_url)
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": database_url})
    app = open_event_store(database_url)
    with FakeGateway(FakeConfig(seed=seed), parents=(PARENT,)) as fake:
        for n, fate in FATES.items():
            fake.script(_title(n), fate)
        fake.seed_workspace(_title(ADOPTS), PARENT, status="created")
        gateway = HttpGateway(fake.url, "demo-token", read_timeout=2.0, retry_backoff_s=0.01)
        service = ProvisioningService(app, gateway, settings=settings.engine())
        started = time.monotonic()
        outcomes = _provision(console, service, brands)
        elapsed = time.monotonic() - started
        state = fake.state()
        gateway.close()
    _summary(console, service, brands, outcomes)
    for n in STORIES:
        _story(console, service, f"demo-{n:02d}")
    creates = sum(state["creates"].values())
    console.print(
        f"\n{brands} brands in {elapsed:.1f} s; {creates} creates upstream for "
        f"{len(state['creates'])} titles; event store: {database_url}"
    )
    app.close()
    return 0


def _provision(
    console: Console, service: ProvisioningService, brands: int
) -> dict[UUID, list[HopOutcome]]:
    by_attempt: dict[UUID, list[HopOutcome]] = {}
    with Progress(
        TextColumn("provisioning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("brands", total=brands)

        def seen(outcome: HopOutcome) -> None:
            by_attempt.setdefault(outcome.attempt_id, []).append(outcome)
            if outcome.brand_id == f"demo-{DEACTIVATED:02d}" and outcome.hop == 0:
                service.deactivate(outcome.brand_id)
            if outcome.outcome not in (Outcome.SCHEDULED, Outcome.DUPLICATE):
                progress.advance(task)

        engine = InProcessEngine(service, concurrency=8, time_scale=TIME_SCALE, on_outcome=seen)
        for n in range(1, brands + 1):
            engine.submit(service.request_provisioning(f"demo-{n:02d}", _title(n), PARENT))
        engine.run(timeout_s=120)
    return by_attempt


def _summary(
    console: Console,
    service: ProvisioningService,
    brands: int,
    outcomes: dict[UUID, list[HopOutcome]],
) -> None:
    table = Table(title="Brands")
    for column in ("brand", "status", "workspace", "hops", "outcome"):
        table.add_column(column)
    tally: Counter[str] = Counter()
    for n in range(1, brands + 1):
        brand = service.brand(f"demo-{n:02d}")
        attempt = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
        hops = outcomes.get(attempt.id, []) if attempt else []
        state = attempt.state.value if attempt else "none"
        tally[state] += 1
        table.add_row(
            brand.brand_id,
            state if brand.is_active else f"{state} (deactivated)",
            brand.workspace_id or "-",
            str(len(hops)),
            _describe(attempt) if attempt else "",
        )
    console.print(table)
    console.print(", ".join(f"{count} {state}" for state, count in sorted(tally.items())))


def _describe(attempt: ProvisioningAttempt) -> str:
    parts = [attempt.provenance.value if attempt.provenance else "no candidate"]
    if attempt.failure_reason is not None:
        parts.append(attempt.failure_reason.value)
    if attempt.released_ids:
        parts.append("released " + ", ".join(attempt.released_ids))
    return "; ".join(parts)


def _story(console: Console, service: ProvisioningService, brand_id: str) -> None:
    brand = service.brand(brand_id)
    if brand.current_attempt_id is None:
        return
    table = Table(title=f"History of {brand_id} (attempt {brand.current_attempt_id})")
    for column in ("time", "event", "details"):
        table.add_column(column)
    for event in service.attempt_history(brand.current_attempt_id):
        fields = {
            k: v
            for k, v in vars(event).items()
            if k not in ("originator_id", "originator_version", "timestamp", "originator_topic")
        }
        table.add_row(
            f"{event.timestamp:%H:%M:%S.%f}"[:-3],
            type(event).__name__,
            ", ".join(f"{k}={v}" for k, v in fields.items())[:90],
        )
    console.print(table)
