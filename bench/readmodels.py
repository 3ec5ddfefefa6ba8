"""Read-model benchmark: seed a big event log, rebuild the projections, time the queries.

    .venv/bin/python bench/readmodels.py [--events 1000000] [--batch 5000] [--samples 300]
                                         [--keep] [--json]

Seeds about --events events on PostgreSQL: brands of two attempts each (the
first failed and released, the second promoted), and one brand in fifty left
pending with its next hop hours overdue (what `attempts --stuck` finds).
The events are made by the domain's own commands and saved 200 aggregates per
transaction. Then, in the same run:

- the raw scan rate of the notification log (every event, batched reads, not
  decoded) and the decoded scan rate;
- each projection rebuilt from the whole log (events/s over both);
- p50/p99 of `history BRAND` and `attempt ID` (the functions the CLI calls,
  straight from the event store) over --samples random brands;
- `attempts --stuck` (limit 50) on the rebuilt projection: median and worst of 20.

Without PROVISIONER_DATABASE_URL it creates a fresh database on the local
server and drops it afterwards (--keep keeps it); with it, that database is
used as it is (and seeded).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from common import drop_database, fresh_database, percentile

from domain.attempt import ProvisioningAttempt
from domain.brand import Brand
from domain.policies import FailureReason, Provenance
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import ProvisionerApplication, init_database, open_event_store
from infrastructure.views.audit import attempt_story, brand_history
from infrastructure.views.log_source import LogSource
from infrastructure.views.queries import list_attempts
from infrastructure.views.store import PROJECTIONS, SqlViewStore, init_read_models
from projections.core import rebuild

EVENTS_PER_BRAND = 14  # 4 brand events, 6 of a failed attempt, 4 of a promoted one


def brand_with_history(index: int, now: datetime) -> tuple[list[Any], str, Any]:
    brand_id = f"rb-{index:07d}-{uuid.uuid4().hex[:6]}"
    title, parent = f"Read Bench {index}", f"parent-{index % 100}"
    brand = Brand.register(brand_id, title, parent)
    first = ProvisioningAttempt.start(brand_id, title, parent, None, max_hop=5)
    brand.begin_attempt(first.id, title, parent, now)
    first.request_create(0, [], now)
    first.accept_candidate(f"ws-{uuid.uuid4().hex[:12]}", Provenance.CREATED, 0)
    first.schedule_hop(1, now, "creating")
    first.fail(FailureReason.EXHAUSTED, "status stayed creating", 1)
    first.record_release(first.candidate_id or "", 0)
    second = ProvisioningAttempt.start(brand_id, title, parent, None, max_hop=5)
    brand.begin_attempt(second.id, title, parent, now + timedelta(microseconds=1))
    second.request_create(0, [], now)
    workspace_id = f"ws-{uuid.uuid4().hex[:12]}"
    second.accept_candidate(workspace_id, Provenance.CREATED, 0)
    if index % 50 == 0:  # left pending, its next hop hours overdue
        second.schedule_hop(1, now - timedelta(hours=2 + index % 7), "creating")
    else:
        second.promote(0)
        brand.bind(workspace_id, second.id)
    return [brand, first, second], brand_id, second.id


def seed(app: ProvisionerApplication, events: int) -> tuple[list[str], list[Any], float]:
    now = datetime.now(UTC)
    brands, attempts, pending = [], [], []
    started = time.perf_counter()
    total = max(1, events // EVENTS_PER_BRAND)
    for index in range(total):
        objects, brand_id, attempt_id = brand_with_history(index, now)
        pending += objects
        brands.append(brand_id)
        attempts.append(attempt_id)
        if len(pending) >= 200:
            app.save(*pending)
            pending.clear()
        if index % 5000 == 0 and index:
            rate = index * EVENTS_PER_BRAND / (time.perf_counter() - started)
            print(f"  seeded {index:,} brands ({rate:,.0f} events/s)", file=sys.stderr)
    if pending:
        app.save(*pending)
    return brands, attempts, time.perf_counter() - started


def scan_rate(app: ProvisionerApplication, batch: int, *, decode: bool) -> tuple[int, float]:
    started = time.perf_counter()
    count, start = 0, 1
    to_event = app.mapper.to_domain_event
    while notes := app.recorder.select_notifications(start, batch):
        if decode:
            for note in notes:
                to_event(note)
        count += len(notes)
        start = notes[-1].id + 1
    return count, count / (time.perf_counter() - started)


def timed_ms(call: Any) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="Keep the fresh database.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")
    args = parser.parse_args()

    url = os.environ.get("PROVISIONER_DATABASE_URL")
    created = None
    if not url:
        url, created = fresh_database()
    try:
        init_database(url)
        init_read_models(url)
        app = open_event_store(url, pool_size=2)
        print(f"seeding about {args.events:,} events into {url} ...", file=sys.stderr)
        brands, attempts, seed_s = seed(app, args.events)
        head = app.recorder.max_notification_id() or 0
        raw_count, raw_rate = scan_rate(app, args.batch, decode=False)
        _, decoded_rate = scan_rate(app, args.batch, decode=True)

        rebuilt: dict[str, dict[str, float]] = {}
        with SqlViewStore(url) as store:
            source = LogSource(app, store)
            for projection in PROJECTIONS.values():
                done: list[int] = [0]
                started = time.perf_counter()
                rebuild(projection, source, store, limit=args.batch,
                        on_progress=lambda p, done=done: done.__setitem__(0, p.done))  # fmt: skip
                seconds = time.perf_counter() - started
                rebuilt[projection.name] = {"events": done[0], "seconds": seconds}
                print(f"  rebuilt {projection.name}: {done[0]:,} events in {seconds:.1f} s",
                      file=sys.stderr)  # fmt: skip

            service = ProvisioningService(app, gateway=None)  # type: ignore[arg-type]
            picks = random.Random(7).sample(range(len(brands)), min(args.samples, len(brands)))
            history = [timed_ms(lambda i=i: brand_history(service, brands[i])) for i in picks]
            one = [timed_ms(lambda i=i: attempt_story(service, attempts[i])) for i in picks]
            stuck_rows: list[Any] = []
            stuck = [
                timed_ms(lambda: stuck_rows.append(list_attempts(store, stuck=True, limit=50)))
                for _ in range(20)
            ]
        app.close()
    finally:
        if created and not args.keep:
            drop_database(created)

    events = sum(r["events"] for r in rebuilt.values())
    seconds = sum(r["seconds"] for r in rebuilt.values())
    result = {
        "events": head and raw_count,
        "brands": len(brands),
        "attempts": 2 * len(brands),
        "seed_events_per_s": round(raw_count / seed_s),
        "scan_events_per_s": round(raw_rate),
        "scan_decoded_events_per_s": round(decoded_rate),
        "rebuild_events_per_s": round(events / seconds),
        "rebuild": {
            k: {"events": v["events"], "seconds": round(v["seconds"], 2)}
            for k, v in rebuilt.items()
        },
        "rebuild_vs_scan": round(events / seconds / raw_rate, 3),
        "history_p50_ms": round(percentile(history, 0.5), 2),
        "history_p99_ms": round(percentile(history, 0.99), 2),
        "attempt_p50_ms": round(percentile(one, 0.5), 2),
        "attempt_p99_ms": round(percentile(one, 0.99), 2),
        "stuck_ms": round(max(stuck), 2),
        "stuck_median_ms": round(statistics.median(stuck), 2),
        "stuck_found": len(stuck_rows[-1]),
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
        print(
            "targets: rebuild >= 20,000 events/s; history p99 <= 20 ms; attempts --stuck <= 100 ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
