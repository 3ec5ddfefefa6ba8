"""What the health checks come to: `Health` runs checks (a name and a function
that returns a short text, or raises `Unhealthy`), remembers since when each has
been failing, and renders the results as lines or as JSON (`report`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infrastructure.redaction import redact

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Unhealthy(Exception):
    """A failing check: what is wrong, and since when if the check knows better."""

    def __init__(self, detail: str, since: datetime | None = None) -> None:
        super().__init__(detail)
        self.since = since


class CheckRefused(Unhealthy):
    """Failing, and no outage: a peer refused us for good (the gateway's certificate does
    not verify). Only a change of setting or certificate fixes it; `health` exits 4."""


class Degraded(Unhealthy):
    """Not failing, but not well: the process still does its work (say, the gateway is
    down, so hops are deferred while commands are still consumed). Readiness holds."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    since: datetime | None = None  # when a failing (or degraded) check started so
    degraded: bool = False  # ok, but not well (`Degraded`)
    refused: bool = False  # failing for good (`CheckRefused`): health's exit code 4

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "degraded": self.degraded,
            "detail": self.detail,
            "since": self.since.isoformat() if self.since else None,
            **({"refused": True} if self.refused else {}),
        }

    def line(self) -> str:
        since = f" (since {self.since.isoformat(timespec='seconds')})" if self.since else ""
        if self.degraded:
            return f"DEGRADED {self.name}: {self.detail}{since}"
        if self.ok:
            return f"ok       {self.name}: {self.detail}"
        return f"FAILING  {self.name}: {self.detail}{since}"


Check = tuple[str, Callable[[], str]]


class Health:
    """Runs checks; a failing one is reported with the time it was first seen failing."""

    def __init__(self, checks: Sequence[Check], *, clock: Clock = utc_now) -> None:
        self.checks = list(checks)
        self._clock = clock
        self._since: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def run(self) -> list[CheckResult]:
        return [self._one(name, check) for name, check in self.checks]

    def _one(self, name: str, check: Callable[[], str]) -> CheckResult:
        try:
            detail = check()
        except Exception as exc:  # noqa: BLE001 - any failure of a check is that check failing
            since = exc.since if isinstance(exc, Unhealthy) else None
            with self._lock:
                first = self._since.setdefault(name, since or self._clock())
            degraded = isinstance(exc, Degraded)
            refused = isinstance(exc, CheckRefused)
            return CheckResult(name, degraded, describe(exc), since or first, degraded, refused)
        with self._lock:
            self._since.pop(name, None)
        return CheckResult(name, True, detail)


def healthy(results: Sequence[CheckResult]) -> bool:
    return all(r.ok for r in results)


def refusal(results: Sequence[CheckResult]) -> CheckResult | None:
    """The first check refused for good (`CheckRefused`), if any."""
    return next((r for r in results if r.refused), None)


def report(results: Sequence[CheckResult]) -> dict[str, Any]:
    status = "ok" if healthy(results) else "failing"
    if status == "ok" and any(r.degraded for r in results):
        status = "degraded"
    return {"status": status, "checks": [r.as_json() for r in results]}


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, Unhealthy):
        return text
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:300]


# -- the checks ------------------------------------------------------------------
