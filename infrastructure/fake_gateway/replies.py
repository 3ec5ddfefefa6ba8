"""The fake gateway's requests and replies, as plain values: no HTTP here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RawJson:
    """A reply body already encoded as JSON, exactly as `json.dumps` with compact
    separators (``(",", ":")``) would encode it: written as it is."""

    data: bytes


@dataclass
class Reply:
    """What to do with a request: answer it, or play a timeout."""

    status: int = 200
    body: object = None  # JSON-encoded when sent, unless already encoded (`RawJson`)
    timeout: bool = False
    hold_s: float = 0.0
    answer_after_hold: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    close_listener: bool = False  # a refuse outage begins: stop listening, then answer


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str
    body: bytes

    def json(self) -> object:
        if not self.body:
            return {}
        return json.loads(self.body)


class NotFoundError(LookupError):
    """A workspace or project the fake does not know."""


class BadRequestError(ValueError):
    """A request the fake refuses, with its status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_reply(status: int, message: str) -> Reply:
    return Reply(status, {"error": message})


Handler = Callable[[Request, tuple[str, ...]], Reply]
