"""Nothing another site's page makes the web view do spends the gateway: requests another
site's page made are refused before anything is read, and the health page calls the
gateway only behind the web token, its answer kept for a minute. Calls are counted at
the fake gateway, a real HTTP server (`/_fake/state`)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from tests.integration.web_fixture import filled_store
from worker.web.app import create_app

BASE = "http://127.0.0.1:8080"  # the Host every request names, as the view is bound
WEB_TOKEN = "web-token-for-the-tests"
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin", "Origin": BASE}


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return filled_store(tmp_path_factory.mktemp("cross-site"))


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    with FakeGateway() as fake:
        yield fake


def calls(fake: FakeGateway) -> int:
    """Gateway calls the fake answered (its admin calls are not counted)."""
    with urllib.request.urlopen(f"{fake.url}/_fake/state", timeout=5) as answer:
        return int(json.load(answer)["calls_total"])


def web(database_url: str, fake: FakeGateway, **env: str) -> TestClient:
    settings = Settings.from_env({
        "PROVISIONER_DATABASE_URL": database_url,
        "PROVISIONER_GATEWAY_URL": fake.url,
        "PROVISIONER_GATEWAY_TOKEN": "the-organisations-token",
        "PROVISIONER_PARENT_IDS": "org-parent",
        **env,
    })  # fmt: skip
    return TestClient(create_app(settings), base_url=BASE)


def gateway_row(page: str) -> str:
    found = re.search(r'<tr class="check-row"><td>gateway</td>(.*?)</tr>', page, re.S)
    assert found, page
    return found.group(1)


def test_twenty_cross_site_gets_of_health_are_refused_and_call_nothing(
    database_url: str, gateway: FakeGateway
) -> None:
    """As a hostile page's `<img src=".../health">` would make them, with no web token
    (the loopback default): before, each made a gateway call with the token."""
    with web(database_url, gateway) as client:
        answers = [
            client.get("/health", headers={"Sec-Fetch-Site": "cross-site"}) for _ in range(10)
        ] + [client.get("/health", headers={"Origin": "http://evil.example"}) for _ in range(10)]

    assert [a.status_code for a in answers] == [403] * 20
    assert answers[0].text.startswith("403: refused a request from another site's page")
    assert answers[-1].text.startswith("403: refused a request from another origin")
    assert all(a.headers["X-Frame-Options"] == "DENY" for a in answers)
    assert calls(gateway) == 0


def test_same_site_and_null_origins_are_refused_too(
    database_url: str, gateway: FakeGateway
) -> None:
    """Another port of this host is the same site but another origin; a sandboxed frame
    or a redirect says `Origin: null`."""
    with web(database_url, gateway, PROVISIONER_WEB_TOKEN=WEB_TOKEN) as client:
        auth = {"Authorization": f"Bearer {WEB_TOKEN}"}
        same_site = client.get("/health", headers={**auth, "Sec-Fetch-Site": "same-site"})
        null = client.get("/", headers={**auth, "Origin": "null"})
        other_port = client.get("/", headers={**auth, "Origin": "http://127.0.0.1:3000"})

    assert (same_site.status_code, null.status_code, other_port.status_code) == (403, 403, 403)
    assert calls(gateway) == 0


def test_without_a_web_token_the_health_page_works_and_says_how_to_check_the_gateway(
    database_url: str, gateway: FakeGateway
) -> None:
    with web(database_url, gateway) as client:
        same_origin = client.get("/health", headers=SAME_ORIGIN)
        typed = client.get("/health", headers={"Sec-Fetch-Site": "none"})  # address bar
        other_name = client.get("/health", headers={"Origin": "http://localhost:8080"})

    assert (same_origin.status_code, typed.status_code, other_name.status_code) == (200, 200, 200)
    row = gateway_row(same_origin.text)
    assert "not checked" in row
    assert "PROVISIONER_WEB_TOKEN" in row
    assert calls(gateway) == 0


def test_with_the_web_token_the_health_page_calls_the_gateway_once_a_minute(
    database_url: str, gateway: FakeGateway
) -> None:
    with web(database_url, gateway, PROVISIONER_WEB_TOKEN=WEB_TOKEN) as client:
        auth = {"Authorization": f"Bearer {WEB_TOKEN}", **SAME_ORIGIN}
        pages = [client.get("/health", headers=auth) for _ in range(5)]
        refused = client.get("/health", headers={**auth, "Sec-Fetch-Site": "cross-site"})

    assert [p.status_code for p in pages] == [200] * 5
    assert "reachable, token accepted" in gateway_row(pages[-1].text)
    assert refused.status_code == 403  # the token does not make another site's page ours
    assert calls(gateway) == 1  # one status read, its answer kept for the others


def test_every_page_refuses_another_sites_request_before_reading(tmp_path: Path) -> None:
    """The refusal comes before anything is read: a store that does not exist is never
    opened (it would answer 503)."""
    settings = Settings.from_env(
        {"PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'absent.sqlite'}"}
    )
    app = create_app(settings)
    with TestClient(app, base_url=BASE, raise_server_exceptions=False) as client:
        for path in ("/", "/stuck", "/lag", "/audit", "/dead-letters", "/brands/b"):
            answer = client.get(path, headers={"Sec-Fetch-Site": "cross-site"})
            assert answer.status_code == 403, path
        assert client.get("/lag", headers=SAME_ORIGIN).status_code == 503
