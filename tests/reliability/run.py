"""One run: set up, provision under fire, drain, reconcile, gather the facts, check."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.request import Request, urlopen

import psycopg

from domain.waits import Backoff
from infrastructure.broker import messages
from infrastructure.broker.topology import COMMAND_KEY
from infrastructure.failures import EXIT_UNAVAILABLE, ServiceUnavailable
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.reliability import chaos, checks, facts
from tests.reliability.plan import Plan, draw, draw_metering, draw_outages
from tests.reliability.processes import Fleet, Isolation, environment, rabbitmqctl, start_fake

FAKE_FLAGS = {
    "--settle-polls": "1",
    "--create-timeout-after-create-rate": "0.10",
    "--create-timeout-without-create-rate": "0.0556",  # drawn after the first: 5 % of all
    "--zombie-rate": "0.05",
    "--throttle-rate": "0.05",
    "--server-error-rate": "0.05",
    "--hang-s": "2.0",
}
SERVICE_KNOBS = {
    "PROVISIONER_GATEWAY_TIMEOUT_S": "1.5",
    "PROVISIONER_BACKOFF_BASE_S": "0.25",
    "PROVISIONER_MAX_REQUEUES": "6",
    "PROVISIONER_CREATE_GRACE_S": "2",
    "PROVISIONER_CONCURRENCY": "8",
    "PROVISIONER_DEFER_MAX_S": "4",  # a deferred hop asks again within 4 s
    "PROVISIONER_GATEWAY_PROBE_S": "2",  # an open circuit probes every 2 s
}
# What a hop may wait out in settle waits (the backoff's sum): every outage is longer.
SETTLE_BUDGET_S = Backoff(
    float(SERVICE_KNOBS["PROVISIONER_BACKOFF_BASE_S"]),
    int(SERVICE_KNOBS["PROVISIONER_MAX_REQUEUES"]),
).total_s()
DUPLICATE_RATE = 0.20
CALLS_PER_BRAND = 8  # about what a brand costs the gateway under the run's faults


@dataclass
class Drivers:
    duplicator: chaos.HopDuplicator
    killer: chaos.WorkerKiller
    pg: chaos.BackendTerminator
    amqp: chaos.ConnectionCloser
    poisoner: chaos.Poisoner
    producer: chaos.CommandProducer
    outages: chaos.OutageMaker
    meter: chaos.GatewayMeter

    def all(self) -> list[chaos.Driver]:
        return [
            self.duplicator, self.killer, self.pg, self.amqp, self.poisoner, self.producer,
            self.outages, self.meter,
        ]  # fmt: skip


@dataclass
class Outcome:
    violations: list[checks.Violation]
    summary: dict[str, Any]
    histories: dict[str, str] = field(default_factory=dict)


def _post(url: str, body: object) -> Any:
    data = json.dumps(body).encode()
    request = Request(url, data, {"Content-Type": "application/json"}, method="POST")
    with urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


T = TypeVar("T")


def _asked_again(ask: Callable[[], T], tries: int = 30) -> T:
    """The run's own reads of its database, asked again for a while when they fail:
    the backend terminator ends our connections too, and the server may be out of
    connection slots for a moment (it is shared)."""
    for attempt in range(tries):
        try:
            return ask()
        except (psycopg.OperationalError, ServiceUnavailable):
            if attempt == tries - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


class Run:
    def __init__(
        self,
        brands: int,
        seed: int,
        workers: int,
        iso: Isolation,
        run_dir: Path,
        outage_s: float | None = None,
    ) -> None:
        self.count, self.seed, self.workers, self.iso, self.run_dir = (
            brands,
            seed,
            workers,
            iso,
            run_dir,
        )
        self.plan: Plan = draw(seed, brands, spread_s=max(5.0, brands / 60))
        self.window = max(15.0, brands / 25)
        self.metering = draw_metering(seed, workers)
        self.outages = draw_outages(seed, SETTLE_BUDGET_S, self.window * 0.4, outage_s)
        # Longer than any run: an attempt failed `deadline` is a violation.
        self.deadline_s = 3600 + brands
        self.fleet = Fleet(run_dir, {})
        self.stop = threading.Event()
        self.notes: list[str] = []

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}:{name}")

    def describe(self) -> str:
        """The gateway's faults drawn for this run, in one line (printed after the seed)."""
        outages = ", ".join(o.describe() for o in self.outages)
        return (
            f"{self.metering.describe()}; outages: {outages} (settle budget {SETTLE_BUDGET_S:g} s)"
        )

    # ------------------------------------------------------------------ phases

    def execute(self) -> Outcome:
        try:
            self._set_up()
            drivers = self._under_fire()
            self._drain_and_reconcile()
            return self._check(drivers)
        finally:
            self.stop.set()
            self.fleet.stop()

    def _set_up(self) -> None:
        fake = dict(FAKE_FLAGS)
        if not self.metering.random_429s:
            fake["--throttle-rate"] = "0"
        flags = [f"--seed={self.seed}", *(f"{k}={v}" for k, v in fake.items())]
        flags += [f"--rate-limit={self.metering.rate_limit:g}", f"--burst={self.metering.burst}"]
        flags += [f"--parent={p}" for p in self.plan.parents]
        self.fake_url = start_fake(self.fleet, flags)
        state = facts.fake_state(self.fake_url)
        self.parents_before = {w["id"]: w for w in state["workspaces"]}
        self.seeded: set[str] = set()
        for title, parent, status, projects in self.plan.others:
            body = {"title": title, "parent": parent, "status": status, "projects": projects}
            self.seeded.add(_post(f"{self.fake_url}/_fake/workspaces", body)["id"])
        if self.plan.terminal:
            _post(f"{self.fake_url}/_fake/scripts", self.plan.terminal)
        knobs = {**SERVICE_KNOBS, **self.metering.env()}
        knobs["PROVISIONER_PARENT_IDS"] = ",".join(self.plan.parents)
        self.fleet.env = environment(self.iso, self.fake_url, knobs)
        for command in (("db", "init"), ("broker", "init")):
            done = self.fleet.one_shot(*command)
            if done.returncode != 0:
                raise RuntimeError(f"provisioner {' '.join(command)}: {done.stderr.strip()}")
        self.worker_names = [f"worker-{n + 1}" for n in range(self.workers)]
        for name in self.worker_names:
            self.fleet.service(name, "worker")
        self.fleet.service("relay", "relay")
        self.fleet.service("projections", "projections", "run")
        self.fleet.service(
            "reconciler", "reconcile", "--overdue", "5", "--grace", "3", "--interval", "3",
            "--deadline", str(self.deadline_s),
        )  # fmt: skip

    def _under_fire(self) -> Drivers:
        publisher = chaos.Publisher(self.iso.broker_url)
        self.publisher = publisher
        admin = self.iso.admin_database_url
        poison = chaos.poison_bodies(self.rng("poison"), max(12, self.count // 40))
        window = self.window
        duplicator = chaos.HopDuplicator(
            self.stop, self.rng("dup"), self.iso.broker_url, DUPLICATE_RATE
        )
        duplicator.start()
        time.sleep(1.0)  # its queue bound before the first hop
        started = time.monotonic()
        cli = threading.Thread(target=self._provision_by_cli, daemon=True)
        cli.start()
        for brand, (title, parent) in self.plan.brands.items():
            if brand not in self.plan.by_cli:
                message = messages.provision(brand, title, parent, requested_at=chaos._now())
                publisher.publish(message.encode(), COMMAND_KEY)
        rng = self.rng
        drivers = Drivers(
            duplicator=duplicator,
            killer=chaos.WorkerKiller(self.stop, rng("kill"), self.fleet, self.worker_names),
            pg=chaos.BackendTerminator(self.stop, rng("pg"), admin, self.iso.name),
            amqp=chaos.ConnectionCloser(self.stop, rng("amqp"), self.iso.name, publisher),
            poisoner=chaos.Poisoner(self.stop, rng("poisoner"), publisher, poison, window * 0.8),
            producer=chaos.CommandProducer(
                self.stop, rng("commands"), publisher, self.plan.commands, started
            ),
            outages=chaos.OutageMaker(
                self.stop, rng("outage-maker"), self.fake_url, self.outages, started
            ),
            meter=chaos.GatewayMeter(self.stop, rng("meter"), self.fake_url),
        )
        for driver in drivers.all()[1:]:
            driver.start()
        cli.join(120)
        # The rate limit sets the pace: as long as the brands need at it, and the outages.
        paced_s = self.count * CALLS_PER_BRAND / self.metering.rate_limit
        deadline = started + max(window * 4, paced_s * 3) + sum(o.seconds for o in self.outages)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if time.monotonic() - started < window:
                continue
            producer, poisoner = drivers.producer, drivers.poisoner
            busy = producer.plan or poisoner.todo or drivers.outages.is_alive()
            if not busy and self._pending() == 0:
                break
        else:
            self.notes.append(f"chaos window ended with {self._pending()} attempts pending")
        self.stop.set()
        for driver in drivers.all():
            driver.join(60)
        self.chaos_s = time.monotonic() - started
        self.fleet.check_alive()
        for name in self.worker_names:  # a worker killed last must be running for the drain
            if self.fleet.procs[name].poll() is not None:
                self.fleet.kill_and_restart(name)
        return drivers

    def _provision_by_cli(self) -> None:
        """Each CLI brand, as an operator would: exit 5 ("a service did not answer", the
        chaos terminating the command's connection) is tried again, as it says."""
        for brand in self.plan.by_cli:
            title, parent = self.plan.brands[brand]
            for attempt in range(5):
                done = self.fleet.one_shot("provision", brand, "--title", title, "--parent", parent)
                if done.returncode != EXIT_UNAVAILABLE:
                    break
                self.notes.append(f"provisioner provision {brand} exited 5; tried again")
                time.sleep(0.5 * 2**attempt)
            if done.returncode != 0:
                self.notes.append(f"provisioner provision {brand} exited {done.returncode}")

    def _pending(self) -> int:
        def ask() -> int:
            with SqlViewStore(self.iso.database_url) as store:
                count = store.scalar("SELECT count(*) AS n FROM attempts WHERE state = 'pending'")
                total = store.scalar("SELECT count(*) AS n FROM attempts")
            return int(count) + max(0, self.count - int(total))

        return _asked_again(ask)

    def _queues_held(self) -> dict[str, int]:
        """The queues that hold messages (the dead letters aside), with their counts."""
        out = rabbitmqctl(
            "list_queues", "-q", "--no-table-headers", "-p", self.iso.name, "name", "messages"
        )
        counts = [line.split() for line in out.splitlines() if line.strip()]
        return {p[0]: int(p[-1]) for p in counts if p[0] != "provisioning.dead" and p[-1] != "0"}

    def _behind(self) -> int:
        """Events (of its topics) the slower projection is behind the log."""
        status = _asked_again(lambda: facts.projection_status(self.iso.database_url))
        return max(item["behind"] for item in status)

    def _drain(self, timeout_s: float, what: str, *, queues: bool = True) -> None:
        """Until three checks a second apart find the queues empty (unless `queues` is
        False: nothing consumes them any more), no attempt pending and the projections
        at the log's head."""
        deadline = time.monotonic() + timeout_s
        quiet = 0
        state: tuple[bool, int, int] = (False, 0, 0)
        held: dict[str, int] = {}
        while time.monotonic() < deadline and quiet < 3:
            time.sleep(1.0)
            held = self._queues_held() if queues else {}
            state = (not held, self._pending(), self._behind())
            quiet = quiet + 1 if state == (True, 0, 0) else 0
        if quiet < 3:
            self.notes.append(
                f"{what}: not drained after {timeout_s:.0f} s (queues holding {held or 'none'}, "
                f"{state[1]} attempts pending, projections {state[2]} events behind)"
            )

    def _drain_and_reconcile(self) -> None:
        started = time.monotonic()
        budget = max(60.0, self.count / 10)
        self._drain(budget, "after the chaos")
        for n in range(2):
            done = self.fleet.one_shot("reconcile", "--once", "--overdue", "0", "--grace", "0")
            self.notes.append(f"reconcile --once: {done.stdout.strip()}")
            self._drain(budget, f"after reconcile {n + 1}")
        self.drain_s = time.monotonic() - started
        self.fleet.check_alive()
        self.fleet.stop([*self.worker_names, "relay", "reconciler"])
        self._drain(budget, "the projections", queues=False)  # the workers are stopped
        self.fleet.stop(["projections"])

    # ------------------------------------------------------------------ checks

    def _check(self, drivers: Drivers) -> Outcome:
        url = self.iso.database_url
        app = open_event_store(url, pool_size=2)
        try:
            read = {b: facts.brand_facts(app, b) for b in self.plan.brands}
            brands = {b: f for b, f in read.items() if f is not None}
            bound = {f.workspace_id for f in brands.values() if f.workspace_id}
            claims = facts.claims_of(app, bound)
            replay = facts.replay_problems(app, url)
        finally:
            app.close()
        before = facts.projection_rows(url)
        rebuilt = self.fleet.one_shot("projections", "rebuild", timeout=600)
        after = facts.projection_rows(url)
        state = facts.fake_state(self.fake_url)
        upstream = checks.Upstream(
            {w["id"]: w for w in state["workspaces"]},
            state["creates"],
            self.parents_before,
            frozenset(self.seeded),
            state["creates_dropped"],
            tuple(drivers.killer.times),
        )
        audit = self.fleet.one_shot("audit", "--json", timeout=300)  # before the fake stops
        poisoner = drivers.poisoner
        self.fleet.stop(["fake-gateway"])
        logs = self.fleet.logs()
        dead = facts.dead_letter_bodies(self.iso.broker_url, poisoner.sent)
        self.dead_letter_repeats = checks.dead_letter_repeats(poisoner.sent, dead)
        found = checks.Facts(
            brands=brands,
            claims=claims,
            upstream=upstream,
            poison=poisoner.sent,
            dead_letters=dead,
            projection_problems=replay,
            rebuild_problems=facts.rebuild_problems(before, after),
            secret_hits=checks.secret_hits(logs, self.iso.secrets()),
        )
        missing = sorted(set(self.plan.brands) - set(brands))
        found.extra += [checks.Violation("brand_never_registered", b, "") for b in missing]
        if rebuilt.returncode != 0:
            found.extra.append(checks.Violation("rebuild_failed", None, rebuilt.stderr[-300:]))
        found.extra += [checks.Violation("process_failed", None, e) for e in self.fleet.exits]
        if audit.returncode in (0, 1) and audit.stdout.lstrip().startswith("["):
            found.extra += checks.audited(json.loads(audit.stdout))
        else:
            found.extra.append(checks.Violation("audit_failed", None, audit.stderr[-300:]))
        for name, text in logs.items():
            if "Traceback" in text:
                found.extra.append(checks.Violation("traceback_in_log", None, name))
        violations = checks.check(found)
        return Outcome(violations, self._summary(drivers, brands, state, violations, logs))

    def _summary(
        self,
        drivers: Drivers,
        brands: dict[str, checks.BrandFacts],
        state: dict[str, Any],
        violations: list[checks.Violation],
        logs: dict[str, str],
    ) -> dict[str, Any]:
        poisoner, producer = drivers.poisoner, drivers.producer
        attempts = [a for b in brands.values() for a in b.attempts]
        faults: dict[str, int] = dict(sorted(state.get("faults", {}).items()))
        faults["terminal_titles_scripted"] = len(self.plan.terminal)
        faults["same_title_workspaces_seeded"] = len(self.plan.others)
        faults["same_title_brands"] = len(self.plan.brands) - len(set(self.plan.brands.values()))
        faults["hops_duplicated"] = drivers.duplicator.count
        faults.update({f"poison_{k}": n for k, n in sorted(poisoner.kinds.items())})
        faults.update({f"command_{k}": n for k, n in sorted(producer.kinds.items())})
        reasons = Counter(a.failure_reason for a in attempts if a.failure_reason)
        m = self.metering
        gateway = {
            "rate_limit": m.rate_limit,
            "burst": m.burst,
            "pace": m.pace,
            "service_rate": m.service_rate,
            "service_burst": m.service_burst,
            "random_429s": m.random_429s,
            "rate_limited": state.get("throttled", 0),
            "outage_calls": state.get("outage_calls", 0),
            "calls_total": state.get("calls_total", 0),
            "peak_calls_per_s": drivers.meter.peak_calls_per_s(),
            "hops_deferred": sum(a.deferrals for a in attempts),
        }
        return {
            "brands": self.count,
            "seed": self.seed,
            "faults": faults,
            "gateway": gateway,
            "outages": drivers.outages.done,
            "kills": drivers.killer.count,
            "backend_terminations": drivers.pg.count,
            "connection_closes": drivers.amqp.count,
            "attempts": dict(sorted(Counter(a.state for a in attempts).items())),
            "failure_reasons": dict(sorted(reasons.items())),
            "creates_upstream": sum(state["creates"].values()),
            "dead_letter_repeats": self.dead_letter_repeats,
            "error_lines": sum(t.count('"level": "ERROR"') for t in logs.values()),
            "driver_errors": {d.name: len(d.errors) for d in drivers.all() if d.errors},
            "chaos_s": round(self.chaos_s, 1),
            "drain_s": round(self.drain_s, 1),
            "notes": self.notes,
            "violations": checks.by_kind(violations),
        }

    def history(self, brand_id: str) -> str:
        done = self.fleet.one_shot("history", brand_id, "--json")
        return done.stdout if done.returncode == 0 else done.stderr
