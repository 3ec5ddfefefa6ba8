"""`provisioner demo`: the service on the embedded default, with faults, in under a minute.

SQLite file, the in-process broker (memory://, with the in-process delay
scheduler), the worker and the relay on threads, the fake gateway in-process
over real HTTP, and the backoff schedule compressed 50 times. Some brands
settle slowly, one create times out after creating, one create leaves a zombie
stub, one's creates fail every time (each shell released, created again until
out of hops), one brand adopts a workspace that already exists,
and one brand is deactivated mid-flight.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from domain.attempt import ProvisioningAttempt
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.service import ProvisioningService
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import persistence_env
from infrastructure.views.log_source import LogSource
from infrastructure.views.store import PROJECTIONS, SqlViewStore
from worker.console import cell
from worker.runtime import Runtime, build

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
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": database_url,
            "PROVISIONER_BROKER_URL": "memory://",
            "PROVISIONER_BACKOFF_BASE_S": str(5.0 * TIME_SCALE),
            "PROVISIONER_FAKE_GATEWAY": "1",  # the demo asks for the fake, always
        }
    )
    with build(settings, fake_config=FakeConfig(seed=seed)) as runtime:
        fake = runtime.fake
        assert fake is not None
        fake_parent = fake.parents[0]
        for n, fate in FATES.items():
            fake.script(_title(n), fate)
        fake.seed_workspace(_title(ADOPTS), fake_parent, status="created")
        stop = threading.Event()
        runtime.start(runtime.worker().run, "worker", stop)
        runtime.start(runtime.relay().run, "relay", stop)
        runtime.start(runtime.projector().run, "projections", stop)
        started = time.monotonic()
        attempts = _provision(console, runtime.service, brands, fake_parent)
        elapsed = time.monotonic() - started
        read_models = _caught_up(runtime)
        stop.set()
        for thread in runtime.threads:
            thread.join(10)
        state = fake.state()
        _summary(console, runtime.service, brands, attempts)
        for n in (n for n in STORIES if n <= brands):
            _story(console, runtime.service, f"demo-{n:02d}")
        console.print(read_models)
    creates = sum(state["creates"].values())
    console.print(
        f"\n{brands} brands in {elapsed:.1f} s through the in-process broker; {creates} creates "
        f"upstream for {len(state['creates'])} titles; events in {database_url}"
    )
    return 0


def _caught_up(runtime: Runtime, timeout_s: float = 10.0) -> str:
    """Wait for the projections to reach the head of the log; describe them."""
    deadline = time.monotonic() + timeout_s
    with SqlViewStore(runtime.views_url) as store:
        while True:
            report = store.status(LogSource(runtime.app))
            if all(item["behind"] == 0 for item in report) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ready = len(store.rows(PROJECTIONS["brand_workspaces"], "status = 'ready'"))
    parts = [
        f"{item['projection']}: {item['rows']} rows, {item['behind']} behind" for item in report
    ]
    return f"Read models: {'; '.join(parts)}; {ready} brands ready in brand_workspaces"


def _provision(
    console: Console, service: ProvisioningService, brands: int, parent: str
) -> dict[UUID, int]:
    """Request every brand, deactivate one mid-flight, and wait for all to end."""
    attempts = {
        service.request_provisioning(f"demo-{n:02d}", _title(n), parent): n
        for n in range(1, brands + 1)
    }
    # None with fewer brands than DEACTIVATED: nothing is deactivated then.
    deactivate = next((a for a, n in attempts.items() if n == DEACTIVATED), None)
    hops: dict[UUID, int] = {}
    with Progress(
        TextColumn("provisioning"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("brands", total=brands)
        deadline = time.monotonic() + 60
        pending = set(attempts)
        while pending and time.monotonic() < deadline:
            for attempt_id in list(pending):
                attempt = service.attempt(attempt_id)
                hops[attempt_id] = attempt.expected_hop + 1
                if attempt_id == deactivate and attempt.candidate_id and not attempt.is_terminal:
                    service.deactivate(attempt.brand_id)
                elif attempt.is_terminal and not attempt.release_owed:
                    pending.discard(attempt_id)
                    progress.advance(task)
            time.sleep(0.05)
    return hops


def _summary(
    console: Console,
    service: ProvisioningService,
    brands: int,
    hops: dict[UUID, int],
) -> None:
    table = Table(title="Brands")
    for column in ("brand", "status", "workspace", "hops", "outcome"):
        table.add_column(column, overflow="fold")
    tally: Counter[str] = Counter()
    for n in range(1, brands + 1):
        brand = service.brand(f"demo-{n:02d}")
        attempt = service.attempt(brand.current_attempt_id) if brand.current_attempt_id else None
        state = attempt.state.value if attempt else "none"
        tally[state] += 1
        table.add_row(
            cell(brand.brand_id),
            state if brand.is_active else f"{state} (deactivated)",
            cell(brand.workspace_id or "-"),  # ids from the gateway: text, not markup
            str(hops.get(attempt.id, 0)) if attempt else "0",
            cell(_describe(attempt)) if attempt else "",
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
    table = Table(title=cell(f"History of {brand_id} (attempt {brand.current_attempt_id})"))
    for column in ("time", "event", "details"):
        table.add_column(column, overflow="fold")
    for event in service.attempt_history(brand.current_attempt_id):
        fields = {
            k: v
            for k, v in vars(event).items()
            if k
            not in (
                "originator_id",
                "originator_version",
                "originator_topic",
                "timestamp",
                "requested_at",
                "max_hop",
            )
        }
        table.add_row(
            f"{event.timestamp:%H:%M:%S.%f}"[:-3],
            type(event).__name__,
            cell(", ".join(f"{k}={v}" for k, v in fields.items())),
        )
    console.print(table)
