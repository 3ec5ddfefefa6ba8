"""The fake gateway's knobs: `FakeConfig`, their names, types and checks."""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, fields
from typing import Any

JsonObject = dict[str, Any]

STATUS_CASES = ("lower", "upper", "title")
_RATE_KNOBS = frozenset(
    {
        "create_timeout_after_create_rate",
        "create_timeout_without_create_rate",
        "zombie_rate",
        "terminal_rate",
        "throttle_rate",
        "server_error_rate",
        "unauthorized_rate",
    }
)


@dataclass
class FakeConfig:
    """The knobs of the fake; every field is JSON-serialisable."""

    seed: int = 0
    settle_polls: int = 0
    settle_s: float = 0.0
    latency_ms: float = 0.0
    create_timeout_after_create_rate: float = 0.0
    create_timeout_without_create_rate: float = 0.0
    zombie_rate: float = 0.0
    terminal_rate: float = 0.0
    throttle_rate: float = 0.0
    server_error_rate: float = 0.0
    unauthorized_rate: float = 0.0
    hang_s: float = 0.0
    same_title_others: int = 0
    status_case: str = "lower"
    rate_limit: float = 0.0  # calls/s admitted over all gateway calls; 0 = no limit
    burst: int = 1  # calls admitted at once before the rate applies (the bucket's size)
    rate_window: float = 0.0  # > 0: a quota of rate_limit x rate_window calls a window

    def __post_init__(self) -> None:
        self.update(asdict(self))

    def update(self, knobs: typing.Mapping[str, object]) -> None:
        """Validate every given knob, then set them all; nothing is set on error.

        Raises InvalidKnobError (a ValueError) naming the unknown or bad knob.
        """
        checked = {name: _check_knob(name, value) for name, value in knobs.items()}
        for name, value in checked.items():
            setattr(self, name, value)

    def to_dict(self) -> JsonObject:
        """The whole configuration as a JSON-ready dict."""
        return asdict(self)


KNOB_NAMES: tuple[str, ...] = tuple(f.name for f in fields(FakeConfig))
KNOB_TYPES: dict[str, type] = {
    name: hint for name, hint in typing.get_type_hints(FakeConfig).items() if name in KNOB_NAMES
}
# What a knob means, where its name does not say it (shown by `--help`).
KNOB_HELP: dict[str, str] = {
    "seed": "seeds the random faults; given, ids follow from it alone (the same every start)",
    "rate_limit": "calls/s over all gateway calls, beyond which they are answered 429; 0 = off",
    "burst": "calls admitted at once before --rate-limit applies (at least 1)",
    "rate_window": (
        "seconds: the limit is a quota of rate_limit x rate_window calls in each window"
        " (429 with Retry-After until it ends), not a token bucket; 0 = a token bucket"
    ),
}


class InvalidKnobError(ValueError):
    """An unknown knob, or a value of the wrong type or range."""


def _check_knob(name: str, value: object) -> object:
    """Return the knob's value coerced to its type, or raise InvalidKnobError."""
    if name not in KNOB_TYPES:
        raise InvalidKnobError(f"unknown knob {name!r} (known: {', '.join(KNOB_NAMES)})")
    kind = KNOB_TYPES[name]
    if kind is str:
        if value not in STATUS_CASES:
            raise InvalidKnobError(
                f"{name} must be one of {', '.join(STATUS_CASES)}, got {value!r}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidKnobError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidKnobError(f"{name} must be finite, got {value!r}")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise InvalidKnobError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value) if kind is int else float(value)
    except OverflowError:
        raise InvalidKnobError(f"{name} is out of range, got {value!r}") from None
    if name != "seed" and number < 0:
        raise InvalidKnobError(f"{name} must not be negative, got {value!r}")
    if name == "burst" and number < 1:
        raise InvalidKnobError(f"burst must be at least 1, got {value!r}")
    if name in _RATE_KNOBS and number > 1:
        raise InvalidKnobError(f"{name} is a rate between 0 and 1, got {value!r}")
    return number
