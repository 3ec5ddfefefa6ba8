"""The web view's actions clicked through in a real headless chromium (as
tests/integration/test_web_browser.py drives it), against PostgreSQL, RabbitMQ and the
fake gateway over HTTP: `provisioner web` with a web token (the browser sends it on
every request), a failed brand retried, a brand deactivated (kept, then emptied now),
a dead letter replayed and another purged, an audit run; each recorded as the CLI
records it. A form whose CSRF token was tampered with, or a POST without the web
token or without the form token, is refused and changes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kombu import Connection
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from domain.brand import DEACTIVATED
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import (
    COMMANDS_QUEUE,
    DEAD_QUEUE,
    HOPS_QUEUE,
    WORK_KEY,
    Topology,
)
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT, TOKEN
from tests.integration.conftest import purge
from tests.integration.web_fixture import chromium, follow
from tests.support import drive
from worker.projector import Projector

ROOT = Path(__file__).resolve().parents[2]
WEB_TOKEN = "web-token-for-the-action-tests"
AUTH = {"Authorization": f"Bearer {WEB_TOKEN}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Site:
    base: str
    database_url: str
    broker_url: str
    gateway: FakeGateway
    failed: str  # a brand whose attempt failed (the gateway said `failed`)
    ready: str  # a brand bound to its workspace
    log: Path  # what `provisioner web` wrote on stderr


def _catch_up(url: str) -> None:
    app = open_event_store(url)
    try:
        with SqlViewStore(url) as store:
            Projector(app, url, database_url=url).step(store)
    finally:
        app.close()


def _brands(url: str, gateway: FakeGateway, tag: str) -> tuple[str, str]:
    """A failed brand and a ready one, provisioned as a worker would."""
    failed, ready = f"act-failed-{tag}", f"act-ready-{tag}"
    gateway.script(f"Failing {tag}", "failed")
    app = open_event_store(url)
    try:
        with HttpGateway(gateway.url, TOKEN, retry_backoff_s=0.0) as http:
            service = ProvisioningService(app, http)
            for brand_id, title in ((failed, f"Failing {tag}"), (ready, f"Ready {tag}")):
                drive(service, service.request_provisioning(brand_id, title, PARENT))
    finally:
        app.close()
    _catch_up(url)
    return failed, ready


@pytest.fixture(scope="module")
def site(
    pg_database: str, rabbit_session_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    config = FakeConfig(seed=uuid.uuid4().int % 2**31)
    with FakeGateway(config, parents=(PARENT,)) as gateway:
        failed, ready = _brands(pg_database, gateway, uuid.uuid4().hex[:8])
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
        env.update({
            "PROVISIONER_DATABASE_URL": pg_database, "PROVISIONER_BROKER_URL": rabbit_session_url,
            "PROVISIONER_GATEWAY_URL": gateway.url, "PROVISIONER_GATEWAY_TOKEN": TOKEN,
            "PROVISIONER_PARENT_IDS": PARENT, "PROVISIONER_WEB_TOKEN": WEB_TOKEN,
        })  # fmt: skip
        log = tmp_path_factory.mktemp("web-actions") / "web.log"
        with log.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "worker.cli.main", "web", "--port", str(port)],
                env=env, cwd=ROOT, stderr=err,
            )  # fmt: skip
            base = f"http://127.0.0.1:{port}"
            try:
                _wait_for(server, base)
                yield Site(base, pg_database, rabbit_session_url, gateway, failed, ready, log)
            finally:
                server.terminate()
                server.wait(10)


def _wait_for(server: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 30
    while True:  # wait for the server to answer (not a timing assertion)
        try:
            with urllib.request.urlopen(urllib.request.Request(base + "/lag", headers=AUTH),
                                        timeout=2):  # fmt: skip
                return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`provisioner web` did not start (exit {server.poll()})")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless chromium that sends the web token on every request it makes (as a
    reverse proxy that adds it would)."""
    with chromium() as driver:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": AUTH})
        yield driver


def _said(browser: webdriver.Chrome) -> list[str]:
    return [p.text for p in browser.find_elements(By.CSS_SELECTOR, "#said p")]


def _logged(site: Site, text: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the server's stderr, flushed line by line
        if text in site.log.read_text():
            return True
        time.sleep(0.1)
    return False


def _brand(site: Site, brand_id: str) -> tuple[object, list[str]]:
    app = open_event_store(site.database_url)
    try:
        service = ProvisioningService(app, HttpGateway("http://127.0.0.1:9", "unused"))
        brand = service.brand(brand_id)
        events = [type(e).__name__ for e in app.events.get(brand.id)]
    finally:
        app.close()
    return brand, events


def _take(url: str, queue: str) -> list[dict[str, object]]:
    """The messages `queue` holds, taken (acked) one by one, their JSON bodies."""
    bodies = []
    with Connection(url, connect_timeout=3) as conn:
        channel = conn.channel()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            bodies.append(json.loads(message.body))
    return bodies


@pytest.fixture
def queues(site: Site) -> Iterator[str]:
    """The broker `provisioner web` uses, its wait, command, hop and dead-letter queues
    empty before and after the test (`purge`, as `rabbit_url` empties them): a hop an
    earlier test left in a wait queue would otherwise land among what this one takes."""

    def empty() -> None:
        purge(site.broker_url, list_wait_queues=True)

    empty()
    yield site.broker_url
    empty()


def _count(url: str, queue: str) -> int:
    with Connection(url, connect_timeout=3) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).message_count)


def test_a_failed_brand_is_retried_from_its_page(
    site: Site, browser: webdriver.Chrome, queues: str
) -> None:
    browser.get(f"{site.base}/brands/{site.failed}")
    assert browser.find_element(By.ID, "brand-status").text == "failed"
    follow(browser, browser.find_element(By.ID, "retry-button"))
    said = _said(browser)
    [command] = _take(queues, COMMANDS_QUEUE)

    assert browser.current_url == f"{site.base}/brands/{site.failed}"  # 303 to the brand
    assert said[0].startswith(f"re-requested {site.failed}: 'Failing ")
    assert f"under {PARENT} (attempt " in said[0]
    assert "failed terminal_status at" in said[0]  # its failure reason, as `retry` prints it
    assert command["type"] == "provision"
    assert command["brand_id"] == site.failed
    assert command["parent_workspace_id"] == PARENT
    assert _logged(site, f"web action retry: re-requested {site.failed}: ")
    browser.refresh()
    assert _said(browser) == []  # said once


def test_a_brand_is_deactivated_kept_then_emptied_now(
    site: Site, browser: webdriver.Chrome
) -> None:
    browser.get(f"{site.base}/brands/{site.ready}")
    assert browser.find_element(By.ID, "retention-keep").is_selected()
    follow(browser, browser.find_element(By.ID, "deactivate-button"))
    kept = _said(browser)
    brand, events = _brand(site, site.ready)

    assert kept[0].startswith(f"brand {site.ready} deactivated; no attempt was pending. "
                              "A worker will empty workspace ws-")  # fmt: skip
    assert browser.find_element(By.ID, "brand-status").text == "deactivated"
    assert brand.lifecycle == DEACTIVATED  # type: ignore[attr-defined]
    later = brand.to_be_emptied_at  # type: ignore[attr-defined]
    assert later is not None
    assert later > datetime.now(UTC)  # the retention window
    assert events.count("Deactivated") == 1

    browser.find_element(By.ID, "retention-purge").click()
    follow(browser, browser.find_element(By.ID, "deactivate-button"))
    now = _said(browser)
    brand, events = _brand(site, site.ready)

    assert now[0].startswith(f"brand {site.ready} was already deactivated; workspace ws-")
    assert brand.to_be_emptied_at <= datetime.now(UTC)  # type: ignore[attr-defined]
    assert events.count("Deactivated") == 2  # as `deactivate --purge-now` records it
    assert _logged(site, f"web action deactivate: brand {site.ready} deactivated;")


def _dead_letter(url: str, body: bytes) -> None:
    broker = Broker(url, Topology(), scheduler=None)
    try:
        broker.declare()
        broker.publish_dead(body, "schema errors", {"hop": "missing"}, WORK_KEY)
    finally:
        broker.close()


def test_a_dead_letter_is_replayed_and_another_purged(
    site: Site, browser: webdriver.Chrome, queues: str
) -> None:
    _dead_letter(queues, b'{"replay": "me"}')
    _dead_letter(queues, b'{"purge": "me"}')
    browser.get(f"{site.base}/dead-letters")
    follow(browser, browser.find_elements(By.CSS_SELECTOR, "a.letter-link")[0])
    first = browser.find_element(By.ID, "letter-id").text
    follow(browser, browser.find_element(By.ID, "replay-button"))
    replayed = _said(browser)
    back = _take(queues, HOPS_QUEUE)

    assert browser.current_url == f"{site.base}/dead-letters"
    assert replayed[0].startswith(f"replayed {first} to ")
    assert replayed[-1] == "1 dead letter(s) replayed"
    assert back == [{"replay": "me"}]  # where it came from
    assert _count(queues, DEAD_QUEUE) == 1

    follow(browser, browser.find_element(By.CSS_SELECTOR, "a.letter-link"))
    second = browser.find_element(By.ID, "letter-id").text
    follow(browser, browser.find_element(By.ID, "purge-button"))
    purged = _said(browser)

    assert purged == [f"purged {second} (schema_error, from provisioning.hops)",
                      "1 dead letter(s) purged"]  # fmt: skip
    assert "no dead letters" in browser.find_element(By.ID, "dead-letters").text
    assert _count(queues, DEAD_QUEUE) == 0
    assert _logged(site, f"web action purge: purged {second}")


def test_an_audit_is_run_from_the_audit_page_and_recorded(
    site: Site, browser: webdriver.Chrome
) -> None:
    browser.get(f"{site.base}/audit")
    Select(browser.find_element(By.ID, "audit-parent")).select_by_value(PARENT)
    follow(browser, browser.find_element(By.ID, "audit-now-button"))
    said = _said(browser)
    # The database is the session's: other tests' parents may be listed too.
    sections = {
        section.find_element(By.TAG_NAME, "h2").text: section
        for section in browser.find_elements(By.CSS_SELECTOR, "section.audit")
    }

    assert browser.current_url == f"{site.base}/audit"
    assert said[0].startswith(f"parent {PARENT}: ")
    assert "bound and ready" in said[0]
    assert PARENT in sections, list(sections)
    when = sections[PARENT].find_element(By.CSS_SELECTOR, ".audit-when").text
    assert "no audit recorded yet" not in when  # recorded, as `provisioner audit` records it
    assert _logged(site, f"web action audit: parent {PARENT}: ")


def test_a_tampered_form_token_is_refused_and_changes_nothing(
    site: Site, browser: webdriver.Chrome
) -> None:
    """The page's own form, its hidden CSRF field changed (through the driver: the
    page itself runs no script) before the click."""
    brand_id = f"act-untouched-{uuid.uuid4().hex[:8]}"
    app = open_event_store(site.database_url)
    try:
        with HttpGateway(site.gateway.url, TOKEN) as http:
            service = ProvisioningService(app, http)
            drive(service, service.request_provisioning(brand_id, f"Untouched {brand_id}", PARENT))
    finally:
        app.close()
    _catch_up(site.database_url)
    browser.get(f"{site.base}/brands/{brand_id}")
    browser.execute_script("document.querySelector('#deactivate input[name=csrf]').value = 'f00'")
    follow(browser, browser.find_element(By.ID, "deactivate-button"))
    message = browser.find_element(By.ID, "message").text
    brand, events = _brand(site, brand_id)

    assert browser.find_element(By.TAG_NAME, "h1").text == "Not done"
    assert message.startswith("403: refused: the form's CSRF token does not match")
    assert "reload the page" in message
    assert "Deactivated" not in events
    assert brand.lifecycle != DEACTIVATED  # type: ignore[attr-defined]


def _post(site: Site, path: str, fields: dict[str, str], headers: dict[str, str]) -> int:
    body = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in fields.items()).encode()
    request = urllib.request.Request(site.base + path, data=body, method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", **headers})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_post_without_the_web_token_or_the_form_token_changes_nothing(
    site: Site, queues: str
) -> None:
    _dead_letter(queues, b'{"stay": "here"}')
    brand = {"brand_id": site.failed, "retention": "purge"}
    cookie = {"Cookie": "provisioner_csrf=" + "n" * 32}
    _, before = _brand(site, site.failed)

    no_web_token = _post(site, "/actions/deactivate", {**brand, "csrf": "x" * 64}, cookie)
    no_form_token = _post(site, "/actions/deactivate", brand, {**AUTH, **cookie})
    no_cookie = _post(site, "/actions/retry", {"brand_id": site.failed, "csrf": "x" * 64}, AUTH)
    purge = _post(site, "/actions/purge", {"letter_id": "0"}, {**AUTH, **cookie})
    _, after = _brand(site, site.failed)

    assert (no_web_token, no_form_token, no_cookie, purge) == (401, 403, 403, 403)
    assert after == before  # no event
    assert _count(queues, COMMANDS_QUEUE) == 0  # nothing published
    assert _count(queues, DEAD_QUEUE) == 1  # nothing purged
