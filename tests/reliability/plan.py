"""What a run does, drawn from its seed before anything starts: the brands, their
titles and parents, the titles scripted to end in a terminal status, the
same-title workspaces of other brands seeded in the family, and the
deactivations and re-requests sent while brands are in flight."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from infrastructure import messages

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
