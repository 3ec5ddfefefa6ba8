"""infrastructure/redaction.py: each secret hidden by its value in every form it takes,
the passwords a URL carries, and the URL-shape fallback for the ones nobody told."""

from __future__ import annotations

import dataclasses
import json
from urllib.parse import quote, quote_plus

import pytest

from infrastructure.redaction import (
    HIDDEN,
    MIN_CHARS,
    NO_SECRETS,
    Secrets,
    redact,
    redact_url,
    url_passwords,
)

TOKEN = "tok-RED-7c1e"
ODD = 'pä ss/w"o\\rd+&?'  # non-ASCII, a space, a slash, a quote, a backslash, + & ?


def every_u(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


@pytest.mark.parametrize(
    "form",
    [
        ODD,
        quote(ODD, safe=""),
        quote(ODD),
        quote_plus(ODD),
        json.dumps(ODD)[1:-1],
        json.dumps(ODD, ensure_ascii=False)[1:-1],
        every_u(ODD),
        every_u(ODD).upper().replace("\\U", "\\u"),
    ],
)
def test_a_secret_is_hidden_in_each_form_it_takes(form: str) -> None:
    assert Secrets.of(ODD).scrub(f"before {form} after") == f"before {HIDDEN} after"


def test_the_url_form_of_a_password_is_hidden_as_written() -> None:
    url = "amqp://svc:p%40ss%2Fw0rd@rabbit/v"
    secrets = Secrets.of(*url_passwords(url))

    assert secrets.scrub(f"failed for {url}") == "failed for amqp://svc:***@rabbit/v"
    assert secrets.scrub("it was p@ss/w0rd") == "it was ***"


def test_longest_first_so_a_secret_holding_another_is_hidden_whole() -> None:
    assert Secrets.of("abcd", "abcdefgh").scrub("x abcdefgh y abcd") == "x *** y ***"


def test_secrets_too_short_to_matter_are_not_looked_for() -> None:
    secrets = Secrets.of("pw1", None, "", TOKEN)

    assert secrets.values == (TOKEN,)
    assert secrets.scrub("pw1 passwords") == "pw1 passwords"
    assert len("pw1") < MIN_CHARS
    assert not Secrets.of("abc")
    assert not NO_SECRETS


def test_a_secret_cut_short_at_the_end_of_a_text_is_hidden() -> None:
    long = "tok-" + "0123456789abcdef" * 4
    secrets = Secrets.of(long)

    assert secrets.scrub(f"type: {long[:50]}") == "type: ***"
    assert secrets.scrub(f"{{'type': '{long}'}}"[:40]) == "{'type': '***"
    assert secrets.scrub("ends in tok-012") == "ends in tok-012"  # too little to tell


def test_the_value_holds_no_secret_in_its_repr_and_cannot_change() -> None:
    secrets = Secrets.of(TOKEN)

    assert TOKEN not in repr(secrets)
    with pytest.raises(dataclasses.FrozenInstanceError):
        secrets.values = ()  # type: ignore[misc]
    assert secrets == Secrets.of(TOKEN, TOKEN)


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"title": f"x{TOKEN}x"}),
        json.dumps({"title": f"x{ODD}x"}),
        json.dumps({"title": f"x{ODD}x"}, ensure_ascii=False),
        '{"title": "x' + every_u(TOKEN) + 'x"}',
        '{"title": "x\\u0074ok-RED-\\u0037c1ex"}',  # only some characters escaped
    ],
)
def test_a_json_body_loses_the_secret_however_it_is_escaped(body: str) -> None:
    scrubbed = Secrets.of(TOKEN, ODD).scrub_bytes(body.encode())

    assert json.loads(scrubbed) == {"title": "x***x"}


def test_a_body_keeps_everything_but_the_secret() -> None:
    secrets = Secrets.of(TOKEN)
    plain = b'{"url": "amqp://u:p@h/", "n": 1}'  # no fallback on bodies: nothing we know

    assert secrets.scrub_bytes(plain) == plain
    assert secrets.scrub_bytes(b"\xff not json " + TOKEN.encode()) == b"\xff not json ***"


def test_every_text_in_a_value_is_scrubbed_keys_too() -> None:
    value = {TOKEN: [f"a {TOKEN}", (TOKEN.encode(), 3)], "n": None, "ok": True}

    assert Secrets.of(TOKEN).scrub_value(value) == {
        HIDDEN: ["a ***", (b"***", 3)], "n": None, "ok": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("url", "passwords"),
    [
        ("postgresql://u:pa ss-word@h/db", ("pa ss-word",)),
        ('postgresql://u"q:pw-s3cret@h/db', ("pw-s3cret",)),
        ("postgresql://u:pa/ss@db/ev", ("pa/ss",)),  # to the last "@", as the pattern reads
        ("amqp://guest:p%40ss@rabbit/v", ("p%40ss", "p@ss")),
        ("postgresql://db/ev?sslpassword=k3y-secret", ("k3y-secret",)),
        ("postgresql://u:pw9x@[::1/db", ("pw9x",)),  # not even a valid URL
        ("amqp://guest:guest@rabbit//", ()),  # the user's own name: shown anyway
        ("postgresql://app:events@db/events", ()),  # the database's name
        ("sqlite:///var/x.sqlite", ()),
        ("memory://", ()),
        ("", ()),
    ],
)
def test_the_passwords_a_url_carries(url: str, passwords: tuple[str, ...]) -> None:
    assert url_passwords(url) == passwords


def test_redact_url_hides_what_the_pattern_misses() -> None:
    for url, password in (("postgresql://u:pa ss-word@h/db", "pa ss-word"),
                          ('postgresql://u"q:pw-s3cret@h/db', "pw-s3cret")):  # fmt: skip
        assert password not in redact_url(url)
        assert password in redact(url)  # the pattern alone does not know it
        assert password not in redact_url(url, f'libpq: bad "{password}" in {url}')


def test_the_pattern_is_the_fallback_for_passwords_nobody_told() -> None:
    assert Secrets.of(TOKEN).scrub("see amqp://u:unknown@h/v") == "see amqp://u:***@h/v"
