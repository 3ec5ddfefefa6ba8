"""The web view's pages through Starlette's TestClient (no socket): what each shows,
escaping, the bearer token, 404s and the brand filters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from infrastructure.settings import Settings, SettingsError, log_secrets
from tests.integration.web_fixture import HOSTILE_ID, HOSTILE_TITLE, filled_store
from worker.cli import main
from worker.web.app import create_app


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return filled_store(tmp_path_factory.mktemp("web"))


def client(database_url: str, **env: str) -> TestClient:
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": database_url, **env})
    return TestClient(create_app(settings))


@pytest.fixture
def web(database_url: str) -> Iterator[TestClient]:
    with client(database_url) as c:
        yield c


def test_the_brand_list_shows_every_brand_with_its_status(web: TestClient) -> None:
    page = web.get("/")

    assert page.status_code == 200
    assert (
        page.text.count('class="brand-row"') == 15
    )  # the demo's 13, the markup brand, the deferred one
    assert "demo-01" in page.text
    assert '<span class="status status-deactivated">deactivated</span>' in page.text


def test_filters_by_status_and_searches_ids_and_titles(web: TestClient) -> None:
    failed = web.get("/", params={"status": "failed"}).text
    by_title = web.get("/", params={"q": "brand 05"}).text
    by_id = web.get("/", params={"q": "DEMO-1", "status": "ready"}).text
    nothing = web.get("/", params={"q": "100%_"}).text

    assert failed.count('class="brand-row"') == 2  # the zombie's and the failing creates'
    assert "demo-07" in failed
    assert "demo-09" in failed
    assert by_title.count('class="brand-row"') == 1
    assert "demo-05" in by_title
    assert by_id.count('class="brand-row"') == 3  # demo-10..12; 13 is deactivated
    assert "no brand matches" in nothing  # % and _ are literal, not wildcards


def test_markup_from_a_brand_is_escaped_everywhere(web: TestClient) -> None:
    listing = web.get("/").text
    page = web.get("/brands/" + HOSTILE_ID)

    assert page.status_code == 200
    for text in (listing, page.text):
        assert HOSTILE_ID not in text
        assert HOSTILE_TITLE not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
        assert "&lt;b&gt;Bold &amp; Co&lt;/b&gt;" in text
    assert "/brands/%3Cscript%3Ealert%281%29%3C/script%3E" in listing


def test_a_brand_page_shows_each_attempt_as_a_timeline(web: TestClient) -> None:
    failed = web.get("/brands/demo-09").text
    deactivated = web.get("/brands/demo-13").text

    assert 'id="brand-status" class="status status-failed">failed<' in failed
    assert "CreateRequested" in failed
    assert "exhausted" in failed  # the failure's reason
    assert "brand: Registered" in failed
    assert "brand: Deactivated" in deactivated
    assert "cancelled" in deactivated


def test_an_unknown_brand_or_page_is_404(web: TestClient) -> None:
    brand = web.get("/brands/no-such-brand")
    page = web.get("/nowhere")

    assert brand.status_code == 404
    assert "no brand &#39;no-such-brand&#39; is registered" in brand.text
    assert page.status_code == 404


def test_stuck_lag_and_dead_letter_pages(web: TestClient) -> None:
    stuck = web.get("/stuck", params={"overdue": "0"}).text
    none_stuck = web.get("/stuck").text
    lag = web.get("/lag").text
    dead = web.get("/dead-letters").text

    assert "&lt;script&gt;" in stuck  # its first hop was never run: overdue
    assert "no attempt is stuck" in none_stuck
    assert "<td>brand_workspaces</td>" in lag
    assert "event(s) behind" in lag
    assert "embedded broker (memory://)" in dead


def test_an_unreachable_store_or_broker_is_said_in_one_line(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'none.sqlite'}",
            "PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:1/",
        }
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as web:
        brands = web.get("/")
        dead = web.get("/dead-letters")

    assert brands.status_code == 503
    assert "no event store at" in brands.text
    assert dead.status_code == 200
    assert "is unavailable" in dead.text
    assert "guest:guest" not in dead.text


def test_with_a_token_every_page_needs_it(database_url: str) -> None:
    with client(database_url, PROVISIONER_WEB_TOKEN="s3cret-token") as web:
        for path in ("/", "/brands/demo-01", "/stuck", "/lag", "/dead-letters", "/nowhere"):
            assert web.get(path).status_code == 401
        wrong = web.get("/", headers={"Authorization": "Bearer nope"})
        right = web.get("/", headers={"Authorization": "Bearer s3cret-token"})

    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"].startswith("Bearer")
    assert right.status_code == 200
    assert "demo-01" in right.text


def test_web_settings_are_checked() -> None:
    default = Settings.from_env({})

    assert (default.web_host, default.web_port, default.web_token) == ("127.0.0.1", 8080, None)
    assert Settings.from_env({"PROVISIONER_WEB_HOST": "0.0.0.0"}).web_host == "0.0.0.0"
    for env in (
        {"PROVISIONER_WEB_HOST": "http://x:80"},
        {"PROVISIONER_WEB_PORT": "0"},
        {"PROVISIONER_WEB_PORT": "http"},
        {"PROVISIONER_WEB_TOKEN": "has space"},
        {"PROVISIONER_WEB_TOKEN": ""},
    ):
        with pytest.raises(SettingsError, match="PROVISIONER_WEB_"):
            Settings.from_env(env)
    assert "tok" not in repr(Settings.from_env({"PROVISIONER_WEB_TOKEN": "tok-value"}))
    assert log_secrets({"PROVISIONER_WEB_TOKEN": "tok-value"}) == ("tok-value",)


def test_the_command_refuses_a_bad_host_before_serving() -> None:
    result = CliRunner().invoke(main, ["web", "--host", "http://0.0.0.0:80"])

    assert result.exit_code == 3, result.output
    assert "--host must be an IP address or a host name" in result.output
