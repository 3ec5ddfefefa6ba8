"""Another site's page in a real headless chromium (as tests/integration/test_web_browser.py
drives it) points 20 images at the web view's `/health`: the browser's own headers get
each one refused, and the gateway (the fake, over HTTP) is never called. The view's own
page still opens. A missing browser skips locally and fails in CI (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from infrastructure.fake_gateway.server import FakeGateway
from tests.integration.web_fixture import chromium, filled_store, web_server

ROOT = Path(__file__).resolve().parents[2]
IMAGES = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def calls(fake: FakeGateway) -> int:
    with urllib.request.urlopen(f"{fake.url}/_fake/state", timeout=5) as answer:
        return int(json.load(answer)["calls_total"])


@pytest.fixture(scope="module")
def gateway() -> Iterator[FakeGateway]:
    with FakeGateway() as fake:
        yield fake


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory, gateway: FakeGateway) -> Iterator[str]:
    """`provisioner web` on loopback with no web token (the default), its gateway the fake."""
    url = filled_store(tmp_path_factory.mktemp("cross-site-browser"))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env.update({
        "PROVISIONER_DATABASE_URL": url, "PROVISIONER_BROKER_URL": "memory://",
        "PROVISIONER_GATEWAY_URL": gateway.url, "PROVISIONER_GATEWAY_TOKEN": "org-token",
        "PROVISIONER_PARENT_IDS": "org-parent", "PROVISIONER_ALLOW_MIXED_EMBEDDED": "1",
    })  # fmt: skip
    with web_server(env, port, ROOT) as base:
        yield base


@pytest.fixture(scope="module")
def hostile(view: str) -> Iterator[str]:
    """Another site: a page at `localhost` (the view is at 127.0.0.1) with 20 images."""
    images = "".join(f'<img src="{view}/health?n={n}" alt="">' for n in range(IMAGES))
    page = f"<!doctype html><title>hostile</title><body>{images}</body>".encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class NetworkLog:
    """What the browser's network log says of each request, across reads of the log:
    its URL, the Sec-Fetch-Site it sent and the status it got (from the raw answer's
    headers: chromium blocks a refused image's text body before the page sees it)."""

    def __init__(self) -> None:
        self.url: dict[str, str] = {}
        self.site: dict[str, str] = {}
        self.status: dict[str, int] = {}

    def read(self, browser: webdriver.Chrome) -> None:
        for entry in browser.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            method, params = message["method"], message.get("params", {})
            rid = params.get("requestId", "")
            if method == "Network.requestWillBeSent":
                self.url[rid] = params["request"]["url"]
            elif method == "Network.requestWillBeSentExtraInfo":
                headers = {k.lower(): v for k, v in params.get("headers", {}).items()}
                self.site[rid] = headers.get("sec-fetch-site", "")
            elif method == "Network.responseReceivedExtraInfo":
                self.status[rid] = params["statusCode"]

    def answers(self, prefix: str) -> list[tuple[int, str]]:
        """(status, Sec-Fetch-Site) of each answered request whose URL starts so."""
        return [(code, self.site.get(rid, "")) for rid, code in self.status.items()
                if self.url.get(rid, "").startswith(prefix)]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """The headless chromium of test_web_browser.py, its network log kept."""
    with chromium({"performance": "ALL"}) as driver:
        yield driver


def test_another_sites_images_are_refused_and_never_reach_the_gateway(
    browser: webdriver.Chrome, view: str, hostile: str, gateway: FakeGateway
) -> None:
    browser.get_log("performance")  # what came before is not this test's
    browser.get(hostile)
    log = NetworkLog()
    deadline = time.monotonic() + 30
    while len(log.answers(f"{view}/health?n=")) < IMAGES and time.monotonic() < deadline:
        log.read(browser)
        time.sleep(0.2)
    answers = log.answers(f"{view}/health?n=")

    assert len(answers) == IMAGES, answers
    assert {code for code, _ in answers} == {403}
    assert {fetched for _, fetched in answers} == {"cross-site"}  # as the browser said it
    assert calls(gateway) == 0

    browser.get(view + "/health")  # the view's own page, typed in: still served
    assert browser.title.startswith("Health")
    gateway_row = browser.find_element(By.XPATH, "//tr[td[1][text()='gateway']]").text
    assert "not checked" in gateway_row
    assert "PROVISIONER_WEB_TOKEN" in gateway_row
    assert calls(gateway) == 0
