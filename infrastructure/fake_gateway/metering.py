"""The fake gateway's metering and faults: the rate limit (`TokenBucket`, or a quota a
window: `FixedWindow`), outages, and the faults drawn for a call, for `FakeState`
(infrastructure/fake_gateway/state.py)."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from infrastructure.fake_gateway.config import FakeConfig, JsonObject
from infrastructure.fake_gateway.replies import BadRequestError, Reply, Request, error_reply

OUTAGE_MODES = ("503", "refuse")


class TokenBucket:
    """The rate limit: ``rate`` tokens a second, at most ``burst`` held, one per call.

    A rate of 0 admits everything. The bucket starts full, and is full again
    after `refill` (a reset, or a new rate or burst). Pure: time is ``now()``.
    """

    def __init__(self, rate: float, burst: int, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now()

    def refill(self, rate: float | None = None, burst: int | None = None) -> None:
        self.rate = self.rate if rate is None else rate
        self.burst = self.burst if burst is None else burst
        self.tokens, self.stamp = float(self.burst), self.now()

    def take(self) -> float:
        """Take a token for a call: 0.0 if there was one, else the seconds until the next."""
        if self.rate <= 0:
            return 0.0
        now = self.now()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class FixedWindow:
    """The rate limit as a quota a window: at most ``rate`` x ``window`` calls (one at
    the least) in each ``window`` seconds, counted from a start, as a gateway that
    allows "600 requests a minute" counts them. A call past the quota is told to
    wait until the window ends (up to the whole window). `refill` starts a window.
    Pure: time is ``now()``.
    """

    def __init__(
        self, rate: float, window: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.now = now
        self.rate = rate
        self.window = window
        self.refill()

    @property
    def quota(self) -> int:
        return max(1, math.floor(self.rate * self.window + 1e-9))

    def refill(self) -> None:
        self.start = self.now()
        self.ends_at, self.used = self.start + self.window, 0

    def take(self) -> float:
        """Count a call in the window: 0.0 if within the quota, else the seconds until
        the window ends."""
        if self.rate <= 0:
            return 0.0
        now = self.now()
        if now >= self.ends_at:  # a new window, on the same grid
            passed = math.floor((now - self.start) / self.window)
            self.ends_at, self.used = self.start + (passed + 1) * self.window, 0
        if self.used < self.quota:
            self.used += 1
            return 0.0
        return self.ends_at - now


def limiter(rate: float, burst: int, window: float) -> TokenBucket | FixedWindow:
    """The fake's rate limit: a token bucket, or with a ``window`` a quota a window."""
    return FixedWindow(rate, window) if window > 0 else TokenBucket(rate, burst)


def refuses(outage: JsonObject | None) -> bool:
    """Whether an outage (as the state shows it) refuses connections now."""
    return outage is not None and outage["mode"] == "refuse" and outage["ends_in_s"] > 0


def retry_after(wait_s: float) -> int:
    """A ``Retry-After`` in whole seconds: the wait rounded up, at least 1."""
    return max(1, math.ceil(wait_s - 1e-9))  # 1e-9: float noise must not add a second


@dataclass
class ScriptedOutage:
    mode: str  # one of OUTAGE_MODES
    ends_at: float  # time.monotonic()
    calls: int = 0  # gateway calls answered 503 (a refused connection is not seen)


class Metering:
    """The outage, the rate limit and the drawn faults of `FakeState`, which holds
    the attributes below; the methods whose names start with `_` need its lock held."""

    lock: threading.Lock
    config: FakeConfig
    rng: random.Random
    faults: dict[str, int]
    bucket: TokenBucket | FixedWindow
    throttled: int
    outage: ScriptedOutage | None
    outage_calls: int

    def _fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def _chance(self, rate: float) -> bool:
        if rate <= 0:
            return False
        if rate >= 1:
            return True
        return self.rng.random() < rate

    def _show_outage(self) -> JsonObject | None:
        if self.outage is None:
            return None
        ends_in_s = max(0.0, self.outage.ends_at - time.monotonic())
        return {
            "mode": self.outage.mode,
            "ends_in_s": round(ends_in_s, 3),
            "calls": self.outage.calls,
        }

    def start_outage(self, seconds: object, mode: object = "503") -> JsonObject | None:
        """Begin an outage of ``seconds`` (0 ends the current one now); answer it as
        the state shows it. BadRequestError (a ValueError) on a bad duration or mode."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise BadRequestError(400, f"seconds must be a number, got {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise BadRequestError(400, f"seconds must be finite, not negative, got {seconds!r}")
        if mode not in OUTAGE_MODES:
            raise BadRequestError(400, f'mode must be "503" or "refuse", got {mode!r}')
        with self.lock:
            now = time.monotonic()
            if seconds > 0:
                self.outage = ScriptedOutage(str(mode), now + seconds)
            elif self.outage is not None:
                self.outage.ends_at = min(self.outage.ends_at, now)
            return self._show_outage()

    def refusing_s(self) -> float:
        """How long a refuse outage still runs (0.0 when there is none)."""
        with self.lock:
            if self.outage is None or self.outage.mode != "refuse":
                return 0.0
            return max(0.0, self.outage.ends_at - time.monotonic())

    def _refusal(self) -> Reply | None:
        """The answer of an outage under way or of an empty bucket, else None."""
        outage = self.outage
        if outage is not None and time.monotonic() < outage.ends_at:
            if outage.mode == "refuse":  # on a connection opened before the port closed
                return Reply(timeout=True)
            outage.calls += 1
            self.outage_calls += 1
            reply = error_reply(503, "service unavailable (outage)")
            reply.headers["Retry-After"] = str(retry_after(outage.ends_at - time.monotonic()))
            return reply
        wait_s = self.bucket.take()
        if wait_s > 0:
            self.throttled += 1
            reply = error_reply(429, "rate limit exceeded")
            reply.headers["Retry-After"] = str(retry_after(wait_s))
            return reply
        return None

    def _draw_fault(self, request: Request) -> Reply | None:
        scheme, _, token = request.authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error_reply(401, "missing or malformed bearer token")
        cfg = self.config
        if self._chance(cfg.unauthorized_rate):
            self._fault("unauthorized")
            return error_reply(401, "invalid credentials")
        if request.method == "GET" and self._chance(cfg.throttle_rate):
            self._fault("throttled")  # a shared tenant's throttling: whatever our rate
            reply = error_reply(429, "too many requests")
            reply.headers["Retry-After"] = "1"
            return reply
        if request.method == "GET" and self._chance(cfg.server_error_rate):
            self._fault("server_error")
            return error_reply(503, "service unavailable")
        return None
