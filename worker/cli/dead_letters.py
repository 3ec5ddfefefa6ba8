"""`provisioner dead-letters`: what `provisioning.dead` holds, replay and purge.

Reading never consumes a message for good (infrastructure/broker/dead_letters.py) and
lists a page at a time (`--limit`, `--after`), after the counts by reason of the
whole queue; an id may be given by a unique prefix. `purge` deletes the letters
named by id or `--reason`, or with `--all` every one, and asks for `--yes`. The
embedded broker (`memory://`) keeps none across processes, which is said in one
line with the configuration exit code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from domain.dead_letter_rules import AmbiguousId, Reason
from infrastructure.broker.dead_letter_parsing import DeadLetterEntry, NotReplayable
from infrastructure.broker.dead_letters import PAGE, PAGE_MAX, DeadLetters, NotFound, now
from infrastructure.settings.parsing import check_url
from infrastructure.settings.table import BROKER_SCHEMES
from worker.actions import cut, purge_lines, replay_lines
from worker.console import echo, load_settings, secrets

BROKER_URL = click.option(
    "--broker-url", envvar="PROVISIONER_BROKER_URL", help="Overrides the setting."
)


@contextmanager
def _dead_letters(broker_url: str | None) -> Iterator[DeadLetters]:
    from worker.actions import dead_letters

    settings = load_settings()
    url = check_url("--broker-url", broker_url or settings.broker_url, BROKER_SCHEMES)
    try:
        with dead_letters(settings, url) as letters:
            yield letters
    except (NotFound, AmbiguousId, NotReplayable) as exc:
        raise click.ClickException(str(exc)) from None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _errors(letter: DeadLetterEntry) -> str:
    return "; ".join(f"{k}: {v}" for k, v in letter.errors.items())


def _counts(counts: list[tuple[str, int]]) -> str:
    """`12 dead letter(s) in all: 7 schema_error, 5 unknown_attempt`."""
    total = sum(n for _, n in counts)
    return f"{total} dead letter(s) in all: " + ", ".join(f"{n} {reason}" for reason, n in counts)


def _reason(letter: DeadLetterEntry) -> str:
    return letter.reason + (f" ({letter.stored_reason})" if letter.stored_reason else "")


REASONS = [reason.value for reason in Reason]


@click.group("dead-letters")
def dead_letters() -> None:
    """What the dead-letter queue (provisioning.dead) holds; replay or purge it."""


@dead_letters.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per dead letter.")
@click.option(
    "--limit",
    default=PAGE,
    show_default=True,
    type=click.IntRange(1, PAGE_MAX),
    help="Dead letters on this page.",
)
@click.option("--after", metavar="ID", help="Start after this dead letter (where a page ended).")
@BROKER_URL
def list_(as_json: bool, limit: int, after: str | None, broker_url: str | None) -> None:
    """The counts by reason of the whole queue, then a page of dead letters: each
    one's id, reason, source queue, age and errors (nothing consumed)."""
    with _dead_letters(broker_url) as letters:
        page = letters.page(limit, after, counted=True)
    found = [letter.scrubbed(secrets()) for letter in page.letters]
    at = now()
    more = f"more after {page.after}: dead-letters list --after {page.after}"
    if as_json:
        echo(json.dumps([x.summary(at) for x in found], default=str, indent=2))
        if page.counts:
            echo(_counts(page.counts), err=True)
        if page.after:
            echo(more, err=True)
        return
    if page.counts:
        echo(_counts(page.counts))
    if not found:
        echo("no dead letters" if after is None else f"no dead letters after {after}")
        return
    for letter in found:
        echo(
            f"{letter.id}  {_age(letter.age_s(at)):>4} ago  from {letter.source_queue}  "
            f"{_reason(letter)}{cut(letter)}"
        )
        if letter.errors:
            echo(f"    {_errors(letter)}")
    echo(f"{len(found)} dead letter(s)" + (f"; {more}" if page.after else ""))


@dead_letters.command("show")
@click.argument("letter_id")
@BROKER_URL
def show(letter_id: str, broker_url: str | None) -> None:
    """One dead letter (LETTER_ID or a unique prefix of it): its reason, errors, where
    it came from, headers and body (its first 8 KiB: `truncated`, with the whole
    body's length and sha256)."""
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
    """Put LETTER_ID (or a unique prefix of it; or --all) back where it came from, with
    its own content type and encoding and without the dead-letter headers; it keeps
    its id. A truncated one cannot be: it is kept and said so."""
    if every == (letter_id is not None):
        raise click.UsageError("give one dead letter's id, or --all")
    with _dead_letters(broker_url) as letters:
        done = letters.replay(letter_id)
    for line in replay_lines(done):
        echo(line)


PURGE_FORMS = (
    "purge deletes dead letters for good: name them by id (or a unique prefix), "
    "--reason R (repeatable), or --all for every one; and add --yes"
)


@dead_letters.command("purge")
@click.argument("letter_ids", nargs=-1, metavar="[LETTER_ID]...")
@click.option(
    "--reason",
    "reasons",
    multiple=True,
    type=click.Choice(REASONS),
    help="Delete the dead letters of this reason (repeatable).",
)
@click.option("--all", "every", is_flag=True, help="Delete every dead letter.")
@click.option("--yes", is_flag=True, help="Confirm: the dead letters are deleted for good.")
@BROKER_URL
def purge(
    letter_ids: tuple[str, ...],
    reasons: tuple[str, ...],
    every: bool,
    yes: bool,
    broker_url: str | None,
) -> None:
    """Delete for good the dead letters of LETTER_IDs (or unique prefixes) or of
    --reason, or --all of them (asks for --yes)."""
    if every == bool(letter_ids or reasons):
        raise click.UsageError(
            "--all deletes every dead letter: give it without ids or --reason"
            if every
            else PURGE_FORMS
        )
    if not yes:
        raise click.UsageError(PURGE_FORMS)
    with _dead_letters(broker_url) as letters:
        if every:
            echo(f"{letters.purge_all()} dead letter(s) purged")
            return
        purged = letters.purge(letter_ids, reasons)
    for line in purge_lines(purged):
        echo(line)
