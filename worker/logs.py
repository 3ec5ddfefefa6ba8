"""Log lines: plain text or one JSON object a line, never a secret.

`PROVISIONER_LOG_FORMAT` (infrastructure/settings/model.py): `text`, `json`, or
`auto` (the default: text on a terminal, JSON otherwise). A JSON line has
`time`, `level`, `logger`, `brand`, `attempt`, `hop`, `outcome`, `reason` and
`message` (the fields a line does not carry are null). The fields come from a
record's `extra` (infrastructure/service.py's hop line, worker/delivery.py's
dead letters); text lines show the message, which already names them.

`Redact`, a filter put on every handler, rewrites each record before any
formatter sees it: the message with its arguments, the traceback (a `--debug`
one too) and every field lose each configured secret in any form it takes
(infrastructure/redaction.py), the password of every URL, and the value of
Authorization headers and Bearer credentials.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from infrastructure.redaction import Secrets

FIELDS = ("brand", "attempt", "hop", "outcome", "reason")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
HIDDEN = "***"
_AUTHORIZATION = re.compile(
    r"""((?:proxy-)?authorization['"]?\s*[:=]\s*['"]?)(?:(?:bearer|basic|token)\s+)?[^\s'",;}]+""",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# What must not reach a terminal raw: every C0 control character but the line break
# (ESC starts the sequences that recolour, move, retitle; BEL, CR, BS, TAB too), DEL,
# and the C1 controls (CSI, OSC, ... as one character).
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` safe to print on a terminal: each control character (C0 but the line
    break, DEL, C1) written out as `\\xNN` instead. Every text a command prints goes
    through it (`echo`, `cell`, error lines, text log lines): ids, titles and errors
    come from a producer or the gateway."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def scrub(text: str, secrets: Secrets | Iterable[str] = ()) -> str:
    """The text without the secrets, URL passwords and Authorization values."""
    known = secrets if isinstance(secrets, Secrets) else Secrets(tuple(secrets))
    text = _AUTHORIZATION.sub(rf"\g<1>{HIDDEN}", known.scrub(text))
    return _BEARER.sub(rf"\g<1>{HIDDEN}", text)


class Redact(logging.Filter):
    """Rewrites a record so that no secret reaches any formatter (never drops one)."""

    def __init__(self, secrets: Secrets | Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = secrets if isinstance(secrets, Secrets) else Secrets(tuple(secrets))

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage(), self.secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, self.secrets)
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None and not isinstance(value, int):  # as the JSON line shows it
                setattr(record, name, scrub(str(value), self.secrets))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            line[name] = value if value is None or isinstance(value, int) else str(value)
        line["message"] = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """Plain lines, printable (`printable`): a text line is for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def formatter(log_format: str, stream: TextIO) -> logging.Formatter:
    if log_format == "json" or (log_format == "auto" and not _is_tty(stream)):
        return JsonFormatter()
    return TextFormatter(TEXT_FORMAT)


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def protect(secrets: Secrets | Iterable[str] = ()) -> Redact:
    """Put one `Redact` on every handler there is (the root's and every logger's)."""
    guard = Redact(secrets)
    loggers: list[logging.Logger | logging.PlaceHolder] = [logging.getLogger()]
    loggers += list(logging.Logger.manager.loggerDict.values())
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            for old in [f for f in handler.filters if isinstance(f, Redact)]:
                handler.removeFilter(old)
            handler.addFilter(guard)
    return guard


PROJECT = "provisioner"  # the project's loggers: provisioner.engine, provisioner.relay, ...
# The libraries' loggers -vv raises (some set a level of their own, psycopg's ERROR).
LIBRARIES = ("httpx", "httpcore", "kombu", "amqp", "eventsourcing", "psycopg", "uvicorn")


def root_level(verbose: int) -> int:
    """The root logger's level for `-v` given `verbose` times: DEBUG from `-vv`."""
    return logging.DEBUG if verbose >= 2 else logging.WARNING


def raise_loggers(verbose: int) -> None:
    """None: the project's loggers inherit the root's WARNING (the long-running
    commands raise their start and stop lines to INFO themselves). `-v`: the
    project's at DEBUG (every hop), the libraries' (httpx, kombu, amqp,
    eventsourcing, psycopg, uvicorn) left at WARNING. `-vv`: both at DEBUG."""
    logging.getLogger(PROJECT).setLevel(logging.DEBUG if verbose >= 1 else logging.NOTSET)
    if verbose >= 2:
        for name in LIBRARIES:
            logging.getLogger(name).setLevel(logging.DEBUG)


def setup(
    level: int,
    log_format: str,
    secrets: Secrets | Iterable[str] = (),
    stream: TextIO | None = None,
) -> logging.Handler | None:
    """The process's one stderr handler, in the format asked for, behind the redaction.

    As `logging.basicConfig`: when the root logger already has a handler that is
    not ours (an embedding application, a test runner), it is left as it is and
    only gets the redaction; None is returned then."""
    root = logging.getLogger()
    foreign = [h for h in root.handlers if not getattr(h, "provisioner", False)]
    if foreign:
        protect(secrets)
        return None
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(log_format, stream))
    for old in list(root.handlers):
        root.removeHandler(old)
    handler.provisioner = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    protect(secrets)
    return handler
