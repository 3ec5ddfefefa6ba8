"""What a run does, drawn from its seed before anything starts: the brands, their
titles and parents, the titles scripted to end in a terminal status, the
same-title workspaces of other brands seeded in the family, and the
deactivations and re-requests sent while brands are in flight; the fake's rate
limit and the service's pace (`draw_metering`), and the gateway's outages
(`draw_outages`), each from a random stream of its own."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from infrastructure.broker import messages

TERMINAL_KINDS = ("creation_failed", "failed", "error", "invalid subscription")
BRANDS_PER_PARENT = 250


@dataclass
class Plan:
    brands: dict[str, tuple[str, str]]  # brand -> (title, parent)
    parents: list[str]
    terminal: dict[str, str] = field(default_factory=dict)  # title -> status
    others: list[tuple[str, str, str, int]] = field(default_factory=list)  # title, parent, ...
    commands: list[tuple[float, str, messages.Message]] = field(default_factory=list)
    by_cli: list[str] = field(default_factory=list)  # brands provisioned by `provisioner provision`


def draw(seed: int, count: int, spread_s: float) -> Plan:
    rng = random.Random(f"{seed}:plan")
    parents = [f"org-{seed % 10_000}-{n}" for n in range(max(1, count // BRANDS_PER_PARENT))]
    brands: dict[str, tuple[str, str]] = {}
    for n in range(count):
        brand = f"brand-{n:05d}"
        parent = parents[n % len(parents)]
        previous = f"brand-{n - len(parents):05d}"
        if previous in brands and rng.random() < 0.05:
            brands[brand] = brands[previous]  # the same title as another brand of the family
        else:
            brands[brand] = (f"Shop {n:05d}", parent)
    plan = Plan(brands, parents, by_cli=list(brands)[: min(4, count)])
    for title, parent in sorted(set(brands.values())):
        if rng.random() < 0.05:
            plan.terminal[title] = rng.choice(TERMINAL_KINDS)
        draw_other = rng.random()
        if draw_other < 0.05:  # another brand's live workspace: never adoptable
            plan.others.append((title, parent, "active", 1))
        elif draw_other < 0.07:  # an empty ready one: adoptable
            plan.others.append((title, parent, "ready", 0))
    for brand, (title, parent) in brands.items():
        if brand in plan.by_cli or rng.random() >= 0.10:
            continue
        at = rng.uniform(0.2, spread_s)
        kind = rng.choice(("deactivate", "re-request", "new title", "deactivate, re-request"))
        if kind in ("deactivate", "deactivate, re-request"):
            plan.commands.append((at, "deactivate", messages.deactivate(brand)))
        if kind == "re-request":
            plan.commands.append((at, "re-request", messages.provision(brand, title, parent)))
        if kind == "new title":
            message = messages.provision(brand, f"{title} (renamed)", parent)
            plan.commands.append((at, "re-request new title", message))
        if kind == "deactivate, re-request":
            message = messages.provision(brand, title, parent)
            plan.commands.append((at + rng.uniform(0.5, 3.0), "reactivate", message))
    return plan


# ---------------------------------------------------------------- the metered gateway

# Unpaced, two workers at concurrency 8 send 20 to 30 gateway calls/s on average
# over a run on the 2-core reference machine (loaded), about 75 in their busiest
# 2 s and more in a single second. The fake's limit is drawn per worker at about
# half of those bursts: it binds whenever the fleet is busy (the pace smooths the
# bursts, or learns from their 429s) without making the run twice as long.
RATE_PER_WORKER = (14.0, 20.0)


@dataclass(frozen=True)
class Metering:
    """The fake's global rate limit, and how the service paces itself against it:
    `PROVISIONER_GATEWAY_RATE` (and `_BURST`) configured near the limit (an operator's
    guess: from 0.8 to 1.2 times it), or unset, learned from the 429s. Learned, the
    fake's random 429s on reads are off (`random_429s`): the service cannot tell
    them from the limit's, and 5 % of reads throttled at random would hold the
    fleet at a few calls/s whatever the limit (AIMD against noise)."""

    rate_limit: float  # calls/s, the fake's `--rate-limit`
    burst: int  # the fake's `--burst`
    pace: str  # "configured" or "learned"
    service_rate: float | None = None  # PROVISIONER_GATEWAY_RATE, when configured
    service_burst: int | None = None  # PROVISIONER_GATEWAY_BURST, when configured

    @property
    def random_429s(self) -> bool:
        return self.pace == "configured"

    def env(self) -> dict[str, str]:
        if self.service_rate is None:
            return {}
        return {
            "PROVISIONER_GATEWAY_RATE": f"{self.service_rate:g}",
            "PROVISIONER_GATEWAY_BURST": str(self.service_burst or 1),
        }

    def describe(self) -> str:
        if self.service_rate is None:
            pace = "learned from 429s (PROVISIONER_GATEWAY_RATE unset; no random 429s)"
        else:
            pace = (
                f"configured at {self.service_rate:g} calls/s, burst {self.service_burst} "
                "(PROVISIONER_GATEWAY_RATE)"
            )
        return f"gateway rate limit {self.rate_limit:g} calls/s, burst {self.burst}; pace {pace}"


def draw_metering(seed: int, workers: int) -> Metering:
    rng = random.Random(f"{seed}:metering")
    low, high = RATE_PER_WORKER
    rate = round(workers * rng.uniform(low, high), 1)
    burst = rng.randint(2, 5)
    if rng.random() < 0.5:
        return Metering(rate, burst, "learned")
    service_rate = round(rate * rng.uniform(0.8, 1.2), 1)
    return Metering(rate, burst, "configured", service_rate, rng.randint(1, burst))


# ---------------------------------------------------------------- outages

OUTAGE_MODES = ("503", "refuse")
# Each outage lasts this many times the settle budget: longer than what a hop
# could wait out before deferrals, so that it would have failed attempts exhausted.
OUTAGE_OVER_BUDGET = (1.3, 1.8)


@dataclass(frozen=True)
class OutagePlan:
    mode: str  # "503" or "refuse"
    at_s: float  # when it begins, seconds after the run began sending the brands
    seconds: float

    def describe(self) -> str:
        return f"{self.mode} for {self.seconds:g} s at {self.at_s:g} s"


def draw_outages(
    seed: int, settle_budget_s: float, first_by_s: float, seconds: float | None = None
) -> list[OutagePlan]:
    """One or two outages: one of either mode, or one of each in a drawn order; the
    first begins between 3 s and `first_by_s` after the brands are sent (attempts in
    flight), the second from 3 to 8 s after the first ends. Each lasts `seconds`,
    else 1.3 to 1.8 times the settle budget."""
    rng = random.Random(f"{seed}:outages")
    modes = [rng.choice(OUTAGE_MODES)] if rng.random() < 0.5 else rng.sample(OUTAGE_MODES, 2)
    at = rng.uniform(3.0, max(3.0, first_by_s))
    out = []
    for mode in modes:
        drawn = settle_budget_s * rng.uniform(*OUTAGE_OVER_BUDGET)
        length = drawn if seconds is None else seconds
        out.append(OutagePlan(mode, round(at, 1), round(length, 1)))
        at += length + rng.uniform(3.0, 8.0)
    return out
