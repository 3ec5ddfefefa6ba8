"""A SQLite store for the web view's tests: the demo's brands (the in-process fake),
plus a brand whose id and title are markup, still pending, and one whose gateway
never answers (two hops deferred), with its read models caught up; `provisioner web`
serving it, and the headless chromium the browser tests drive."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from domain.waits import Deferral
from infrastructure.gateway.adapter import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import unavailable
from worker.demo import run_demo
from worker.projector import Projector

HOSTILE_ID = "<script>alert(1)</script>"
DEFERRED_ID = "demo-deferred"  # its gateway never answers: two hops deferred
HOSTILE_TITLE = "<b>Bold & Co</b>"
DEMO_BRANDS = 13  # demo-07 and -09 fail, demo-13 is deactivated, the rest are ready


def filled_store(directory: Path) -> str:
    url = f"sqlite:///{directory / 'web.sqlite'}"
    assert run_demo(brands=DEMO_BRANDS, seed=11, database_url=url) == 0
    app = open_event_store(url)
    try:
        # Nothing listens on port 9: every call is refused. Deferred 10 minutes ahead,
        # so the brand is never overdue while the tests look.
        settings = EngineSettings(
            deferral=Deferral(
                base_s=600.0, max_s=600.0, deadline_s=86_400.0, retry_after_max_s=300.0
            )
        )
        gateway = HttpGateway("http://127.0.0.1:9", "unused", retry_backoff_s=0.0)
        service = ProvisioningService(app, gateway, settings=settings)
        service.request_provisioning(HOSTILE_ID, HOSTILE_TITLE, "org-parent")
        deferred = service.request_provisioning(DEFERRED_ID, "Deferred Co", "org-parent")
        service.run_hop(deferred, 0)
        service.run_hop(deferred, 1)
        with SqlViewStore(url) as store:
            Projector(app, url, database_url=url).step(store)
    finally:
        app.close()
    return url


@contextmanager
def web_server(env: dict[str, str], port: int, cwd: Path) -> Iterator[str]:
    """`provisioner web` on `port` in a subprocess with `env`, once it answers: its
    base URL; stopped on exit."""
    server = subprocess.Popen(
        [sys.executable, "-m", "worker.cli.main", "web", "--port", str(port)], env=env, cwd=cwd
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # wait for the server to answer (not a timing assertion)
            try:
                with urllib.request.urlopen(base + "/lag", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"`provisioner web` did not start (exit {server.poll()})")
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(10)


@contextmanager
def chromium(logs: dict[str, str] | None = None) -> Iterator[webdriver.Chrome]:
    """Debian's headless chromium driven by selenium, quit on exit; `logs`: the logs it
    keeps (`{"browser": "ALL"}`: CSP violations show there). A missing browser skips
    locally and fails in CI (tests/conftest.py)."""
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        unavailable("chromium and chromedriver (`make browser`)", FileNotFoundError("not on PATH"))
    assert binary is not None
    assert driver_path is not None
    options = Options()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--disable-gpu"):  # fmt: skip
        options.add_argument(flag)
    if logs:
        options.set_capability("goog:loggingPrefs", logs)
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    except WebDriverException as exc:
        unavailable("the headless chromium", exc)
        raise
    try:
        yield driver
    finally:
        driver.quit()


def follow(browser: webdriver.Chrome, click: WebElement) -> None:
    """Click, and wait until the next page replaced this one. While the old page goes,
    chromedriver may say so with an "unknown error" ("node ... does not belong to the
    document") rather than a stale element: either means it is gone."""
    page = browser.find_element(By.TAG_NAME, "main")
    click.click()

    def gone(_driver: webdriver.Chrome) -> bool:
        try:
            page.is_enabled()
        except (StaleElementReferenceException, WebDriverException):
            return True
        return False

    WebDriverWait(browser, 30).until(gone)
