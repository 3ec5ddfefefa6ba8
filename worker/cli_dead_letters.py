"""`provisioner dead-letters`: what `provisioning.dead` holds, replay and purge.

Reading never consumes a message for good (infrastructure/dead_letters.py) and
lists a page at a time (`--limit`, `--after`); the embedded broker (`memory://`)
keeps none across processes, which is said in one line with the configuration
exit code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from infrastructure.broker_failures import broker_failure
from infrastructure.dead_letters import (
    PAGE,
    PAGE_MAX,
    DeadLetter,
    DeadLetters,
    NotFound,
    NotReplayable,
    now,
)
from infrastructure.settings import BROKER_SCHEMES, check_url
from worker.cli_support import echo, load_settings, secrets

BROKER_URL = click.option(
    "--broker-url", envvar="PROVISIONER_BROKER_URL", help="Overrides the setting."
)


@contextmanager
def _dead_letters(broker_url: str | None) -> Iterator[DeadLetters]:
    settings = load_settings()
    url = check_url("--broker-url", broker_url or settings.broker_url, BROKER_SCHEMES)
    from infrastructure.broker import Topology

    try:
        tls = settings.broker_tls()
        with DeadLetters(url, Topology(queue_type=settings.queue_type), tls=tls) as letters:
            yield letters
    except (NotFound, NotReplayable) as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        failure = broker_failure(exc, url)
        if failure is None:
            raise
        raise failure from exc


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _errors(letter: DeadLetter) -> str:
    return "; ".join(f"{k}: {v}" for k, v in letter.errors.items())


def _cut(letter: DeadLetter) -> str:
    return f" (cut to {len(letter.body)} of {letter.body_bytes} bytes)" if letter.truncated else ""


@click.group("dead-letters")
def dead_letters() -> None:
    """What the dead-letter queue (provisioning.dead) holds; replay or purge it."""


@dead_letters.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per dead letter.")
@click.option("--limit", default=PAGE, show_default=True, type=click.IntRange(1, PAGE_MAX),
              help="Dead letters on this page.")  # fmt: skip
@click.option("--after", metavar="ID", help="Start after this dead letter (where a page ended).")
@BROKER_URL
def list_(as_json: bool, limit: int, after: str | None, broker_url: str | None) -> None:
    """A page of dead letters: each one's id, reason, source queue, age and errors
    (nothing consumed)."""
    with _dead_letters(broker_url) as letters:
        page = letters.page(limit, after)
    found = [letter.scrubbed(secrets()) for letter in page.letters]
    at = now()
    more = f"more after {page.after}: dead-letters list --after {page.after}"
    if as_json:
        echo(json.dumps([x.summary(at) for x in found], default=str, indent=2))
        if page.after:
            echo(more, err=True)
        return
    if not found:
        echo("no dead letters" if after is None else f"no dead letters after {after}")
        return
    for letter in found:
        echo(
            f"{letter.id}  {_age(letter.age_s(at)):>4} ago  from {letter.source_queue}  "
            f"{letter.reason}{_cut(letter)}"
        )
        if letter.errors:
            echo(f"    {_errors(letter)}")
    echo(f"{len(found)} dead letter(s)" + (f"; {more}" if page.after else ""))


@dead_letters.command("show")
@click.argument("letter_id")
@BROKER_URL
def show(letter_id: str, broker_url: str | None) -> None:
    """One dead letter: its reason, errors, where it came from, headers and body (its
    first 8 KiB: `truncated`, with the whole body's length and sha256)."""
    with _dead_letters(broker_url) as letters:
        letter = letters.show(letter_id).scrubbed(secrets())
    shown: dict[str, Any] = letter.summary(now())
    shown["headers"] = letter.replay_headers
    shown["body"] = letter.body.decode("utf-8", "replace")
    echo(json.dumps(shown, default=str, indent=2))


@dead_letters.command("replay")
@click.argument("letter_id", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every dead letter.")
@BROKER_URL
def replay(letter_id: str | None, every: bool, broker_url: str | None) -> None:
    """Put LETTER_ID (or --all) back where it came from, without the dead-letter headers.
    A truncated one cannot be: it is kept and said so."""
    if every == (letter_id is not None):
        raise click.UsageError("give one dead letter's id, or --all")
    with _dead_letters(broker_url) as letters:
        done = letters.replay(letter_id)
    for letter in done.replayed:
        echo(f"replayed {letter.id} to {letter.exchange}/{letter.routing_key}")
    for letter in done.kept:
        echo(f"kept {letter.id}: its body is not whole{_cut(letter)}, it cannot be replayed")
    kept = f"; {len(done.kept)} kept, truncated" if done.kept else ""
    echo(f"{len(done.replayed)} dead letter(s) replayed{kept}")


@dead_letters.command("purge")
@click.option("--yes", is_flag=True, help="Confirm: the dead letters are deleted for good.")
@BROKER_URL
def purge(yes: bool, broker_url: str | None) -> None:
    """Delete every dead letter for good (asks for --yes)."""
    if not yes:
        raise click.UsageError("purging deletes every dead letter for good: add --yes")
    with _dead_letters(broker_url) as letters:
        count = letters.purge()
    echo(f"{count} dead letter(s) purged")
