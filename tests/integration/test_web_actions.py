"""The web view's actions through Starlette's TestClient (no socket), on an empty
SQLite store: the rule every POST passes (the web token configured and sent, the
form's CSRF token of this browser's cookie, the same-origin checks), what a refusal
says, and that a refused POST records nothing; a deactivation that passes is
recorded and said once. tests/integration/test_web_actions_browser.py clicks every
action in chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from domain.errors import UnknownBrand
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import init_database
from infrastructure.views.store import init_read_models
from worker.actions import request_service
from worker.web import csrf
from worker.web.app import create_app

BASE = "http://127.0.0.1:8080"
WEB_TOKEN = "web-token-for-the-tests"
AUTH = {"Authorization": f"Bearer {WEB_TOKEN}"}
ACTIONS = ("/actions/retry", "/actions/deactivate", "/actions/replay", "/actions/purge",
           "/actions/audit")  # fmt: skip


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    init_read_models(url)
    return Settings.from_env({"PROVISIONER_DATABASE_URL": url, "PROVISIONER_WEB_TOKEN": WEB_TOKEN})


@pytest.fixture
def web(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=BASE, headers=AUTH) as client:
        yield client


def _registered(settings: Settings, brand_id: str) -> bool:
    """Whether the event store has the brand (a deactivation records a tombstone)."""
    service = request_service(settings, read_only=True)
    try:
        service.brand(brand_id)
    except UnknownBrand:
        return False
    finally:
        service.app.close()
    return True


def _nonce(web: TestClient) -> str:
    """The nonce a page gives this browser in its cookie."""
    web.get("/nowhere")  # any page will do: this one reads nothing
    nonce = web.cookies.get(csrf.COOKIE)
    assert nonce is not None
    return nonce


def _message(answer: Any) -> str:
    found = re.search(r'id="message">([^<]*)<', answer.text)
    assert found, answer.text
    return found.group(1).replace("&#39;", "'").replace("&lt;", "<").replace("&gt;", ">")


DEACTIVATE = {"brand_id": "b-1", "retention": "purge"}


def test_a_deactivation_with_both_tokens_is_recorded_and_said_once(
    web: TestClient, settings: Settings
) -> None:
    nonce = _nonce(web)
    done = web.post("/actions/deactivate", data={**DEACTIVATE, "csrf": csrf.form_token(
        WEB_TOKEN, nonce)}, follow_redirects=False)  # fmt: skip
    page = web.get(done.headers["location"])
    again = web.get(done.headers["location"])

    assert done.status_code == 303
    assert done.headers["location"] == "/brands/b-1"
    assert _registered(settings, "b-1")  # as `provisioner deactivate b-1` records it
    assert '<div class="notice done" id="said"><p>brand b-1 deactivated' in page.text
    assert 'id="said"' not in again.text
    assert web.cookies.get(csrf.COOKIE) == nonce  # the nonce lasts the browser's session


def test_a_page_carries_the_form_token_of_its_cookie(web: TestClient) -> None:
    page = web.get("/audit")
    nonce = web.cookies.get(csrf.COOKIE)
    again = web.get("/audit")
    fields = re.findall(r'name="csrf" value="([0-9a-f]+)"', page.text + again.text)

    assert page.status_code == 200
    assert csrf.is_nonce(nonce)
    assert "httponly" in page.headers["set-cookie"].lower()
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    assert "set-cookie" not in again.headers  # one nonce for the browser's session
    assert page.headers["cache-control"] == "no-store"
    assert fields == [csrf.form_token(WEB_TOKEN, str(nonce))] * 2


@pytest.mark.parametrize(
    ("cookie", "field", "refused"),
    [
        (None, "x" * 64, csrf.NO_COOKIE),
        ("A" * 32, None, csrf.NO_FIELD),
        ("A" * 32, "0" * 64, csrf.MISMATCH),
        ("A" * 32, csrf.form_token(WEB_TOKEN, "B" * 32), csrf.MISMATCH),  # another browser's
        ("A" * 32, csrf.form_token("another-token", "A" * 32), csrf.MISMATCH),
    ],
)
def test_a_post_failing_the_csrf_check_is_refused_and_records_nothing(
    web: TestClient, settings: Settings, cookie: str | None, field: str | None, refused: str
) -> None:
    form = {**DEACTIVATE, **({"csrf": field} if field is not None else {})}
    answers = []
    for path in ACTIONS:
        web.cookies.clear()  # a refusal's page gives a browser without one a nonce
        if cookie is not None:
            web.cookies.set(csrf.COOKIE, cookie)
        answers.append(web.post(path, data=form))

    assert [a.status_code for a in answers] == [403] * len(ACTIONS)
    assert {_message(a) for a in answers} == {refused}
    assert not _registered(settings, "b-1")


def test_without_the_web_token_configured_nothing_acts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    init_database(url)
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": url})
    with TestClient(create_app(settings), base_url=BASE) as web:
        web.cookies.set(csrf.COOKIE, "A" * 32)
        form = {**DEACTIVATE, "csrf": csrf.form_token("guessed", "A" * 32)}
        answers = [web.post(path, data=form) for path in ACTIONS]
        brand = web.get("/brands/b-1")

    assert [a.status_code for a in answers] == [403] * len(ACTIONS)
    assert {_message(a) for a in answers} == {csrf.NOT_CONFIGURED}
    assert not _registered(settings, "b-1")
    assert brand.status_code == 404
    assert csrf.COOKIE not in brand.headers.get("set-cookie", "")  # no token: no nonce


def test_without_the_bearer_token_or_from_another_site_nothing_acts(
    web: TestClient, settings: Settings
) -> None:
    nonce = _nonce(web)
    form = {**DEACTIVATE, "csrf": csrf.form_token(WEB_TOKEN, nonce)}
    no_bearer = web.post("/actions/deactivate", data=form, headers={"Authorization": ""})
    cross_site = web.post("/actions/deactivate", data=form,
                          headers={"Sec-Fetch-Site": "cross-site"})  # fmt: skip
    other_origin = web.post("/actions/deactivate", data=form,
                            headers={"Origin": "http://evil.example"})  # fmt: skip

    assert no_bearer.status_code == 401
    assert cross_site.status_code == 403
    assert cross_site.text.startswith("403: refused a request from another site's page")
    assert other_origin.status_code == 403
    assert not _registered(settings, "b-1")


def test_only_our_forms_posted_act(web: TestClient, settings: Settings) -> None:
    nonce = _nonce(web)
    field = csrf.form_token(WEB_TOKEN, nonce)
    got = web.get("/actions/deactivate")
    as_json = web.post("/actions/deactivate", json={**DEACTIVATE, "csrf": field})
    no_choice = web.post("/actions/deactivate", data={"brand_id": "b-1", "csrf": field})
    no_brand = web.post("/actions/retry", data={"csrf": field})
    too_big = web.post("/actions/audit", data={"csrf": field, "parent": "p" * 9000})

    assert got.status_code == 405  # POST only
    assert (as_json.status_code, no_choice.status_code, no_brand.status_code) == (400, 400, 400)
    assert too_big.status_code == 400
    assert "keep it for the retention window, or empty it now" in _message(no_choice)
    assert _message(no_brand).startswith("the form names no brand id")
    assert not _registered(settings, "b-1")


def test_an_action_that_cannot_be_done_says_what_to_do(web: TestClient) -> None:
    field = csrf.form_token(WEB_TOKEN, _nonce(web))
    retry = web.post("/actions/retry", data={"brand_id": "b-1", "csrf": field})
    replay = web.post("/actions/replay", data={"letter_id": "abc", "csrf": field})
    audit = web.post("/actions/audit", data={"csrf": field})

    assert retry.status_code == 409  # memory:// reaches no worker
    assert "set PROVISIONER_BROKER_URL" in _message(retry)
    assert replay.status_code == 409
    assert "embedded broker" in _message(replay)
    assert audit.status_code == 409
    assert "PROVISIONER_GATEWAY_URL" in _message(audit)  # the audit reads the real gateway
