"""The web view's CSRF rule (worker/web/csrf.py) as pure functions: no action without
the web token; a form token is the HMAC of the browser's nonce keyed by the web
token, so it is worth nothing with another nonce, another token, or none."""

from __future__ import annotations

from worker.web import csrf

TOKEN = "web-token"
NONCE = "A" * 32


def test_a_form_token_of_the_cookies_nonce_is_accepted() -> None:
    field = csrf.form_token(TOKEN, NONCE)

    assert csrf.refusal(TOKEN, NONCE, field) is None
    assert len(field) == 64
    assert field == csrf.form_token(TOKEN, NONCE)  # the same page, reloaded


def test_without_a_web_token_nothing_acts() -> None:
    field = csrf.form_token(TOKEN, NONCE)

    for token in (None, ""):
        refused = csrf.refusal(token, NONCE, field)
        assert refused == csrf.NOT_CONFIGURED
        assert refused.startswith("403: ")
        assert "PROVISIONER_WEB_TOKEN" in refused


def test_each_missing_or_wrong_part_is_refused_with_what_to_do() -> None:
    field = csrf.form_token(TOKEN, NONCE)
    other_nonce = "B" * 32

    assert csrf.refusal(TOKEN, None, field) == csrf.NO_COOKIE
    assert csrf.refusal(TOKEN, "short", field) == csrf.NO_COOKIE  # not a nonce of ours
    assert csrf.refusal(TOKEN, NONCE, None) == csrf.NO_FIELD
    assert csrf.refusal(TOKEN, NONCE, "") == csrf.NO_FIELD
    assert csrf.refusal(TOKEN, NONCE, "0" * 64) == csrf.MISMATCH
    assert csrf.refusal(TOKEN, other_nonce, field) == csrf.MISMATCH  # another browser's
    assert csrf.refusal("another-token", NONCE, field) == csrf.MISMATCH  # another server's
    assert csrf.refusal(TOKEN, NONCE, field.upper()) == csrf.MISMATCH
    for refused in (csrf.NO_COOKIE, csrf.NO_FIELD, csrf.MISMATCH):
        assert refused.startswith("403: refused: ")
        assert "\n" not in refused


def test_nonces_are_fresh_and_well_formed() -> None:
    nonces = {csrf.new_nonce() for _ in range(100)}

    assert len(nonces) == 100
    assert all(csrf.is_nonce(n) for n in nonces)
    assert not csrf.is_nonce(None)
    assert not csrf.is_nonce("A" * 31 + ";")


def test_what_an_action_said_is_read_back_only_when_signed_by_this_token() -> None:
    lines = ["brand <b> deactivated; ×", "second line"]
    value = csrf.signed_lines(TOKEN, lines)
    body, _, mac = value.rpartition(".")

    assert value.isascii()
    assert csrf.read_lines(TOKEN, value) == lines
    assert csrf.read_lines("another-token", value) == []
    assert csrf.read_lines(None, value) == []
    assert csrf.read_lines(TOKEN, body + "." + "0" * len(mac)) == []
    assert csrf.read_lines(TOKEN, "garbage") == []
    assert csrf.read_lines(TOKEN, csrf.signed_lines(TOKEN, ["x" * 1000] * 20)) == ["x" * 300] * 10
