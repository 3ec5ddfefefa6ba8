"""The web view in a real headless browser (Debian's chromium, driven by selenium):
`provisioner web` serves a store the demo filled, and the test reads what a person
would see. A missing browser skips locally and fails in CI (tests/conftest.py)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from domain.upstream_audit import Action, Audit, Finding, Kind
from infrastructure.views.audit_findings import FindingsWriter
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import TABLE as PROCESSES
from infrastructure.views.heartbeats import Heartbeat
from tests.integration.web_fixture import HOSTILE_ID, chromium, filled_store, follow, web_server

ROOT = Path(__file__).resolve().parents[2]
# docs/web-brand.png is refreshed by hand: PROVISIONER_SCREENSHOT=docs/web-brand.png make test
SCREENSHOT_TO = os.environ.get("PROVISIONER_SCREENSHOT")
HOSTILE_HOST = "<i>host</i>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = filled_store(tmp_path_factory.mktemp("browser"))
    orphan = Finding(Kind.ORPHAN, "org-parent", "ws-orphan", "made by an unresolved create",
                     "Bold & Co", (HOSTILE_ID,), status="ready", projects=0,
                     action=Action.RELEASE)  # fmt: skip
    assert FindingsWriter(url).write([Audit("org-parent", (orphan,), {})])
    beat_workers(url)
    port = _free_port()
    env = {**os.environ, "PROVISIONER_DATABASE_URL": url, "PROVISIONER_BROKER_URL": "memory://"}
    env.pop("PROVISIONER_WEB_TOKEN", None)
    with web_server(env, port, ROOT) as base:
        yield base


def beat_workers(url: str) -> None:
    """A worker that beats (its clock ahead: alive however long the tests take), one
    whose host name is markup, silent for ten minutes, and a relay (in place of the
    demo's)."""
    ahead, answered = time.time() + 3600, time.time() - 5
    alive = Heartbeat(url, "worker", every_s=0, clock=lambda: ahead,
                      gauges=lambda: (16, 3, 1200), answered_at=lambda: answered)  # fmt: skip
    silent = Heartbeat(url, "worker", every_s=0, clock=lambda: time.time() - 600,
                       gauges=lambda: (4, 0, 7))  # fmt: skip
    silent.host, silent.pid, silent.process = HOSTILE_HOST, 41, f"{HOSTILE_HOST}:41"
    relay = Heartbeat(url, "relay", every_s=0)
    with ViewConnection(url) as conn, conn._tx() as cur:
        cur.execute(f"DELETE FROM {PROCESSES}")
    for heart in (alive, silent, relay):
        assert heart.beat()
        heart.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with chromium({"browser": "ALL"}) as driver:  # CSP violations show in its log
        yield driver


def _cells(browser: webdriver.Chrome, row_css: str) -> list[list[str]]:
    rows = browser.find_elements(By.CSS_SELECTOR, row_css)
    return [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]


def test_a_person_finds_brands_by_status_and_reads_a_timeline(
    site: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    browser.get(site + "/")
    every = _cells(browser, "tr.brand-row")
    status_of = {row[0]: row[2] for row in every}

    assert browser.title == "Brands · provisioner"
    assert status_of["demo-01"] == "ready"
    assert status_of["demo-09"] == "failed"
    assert status_of["demo-13"] == "deactivated"
    assert status_of["<script>alert(1)</script>"] == "pending"  # shown as text, never run

    Select(browser.find_element(By.ID, "status")).select_by_value("failed")
    follow(browser, browser.find_element(By.ID, "filter"))
    failed = [row[0] for row in _cells(browser, "tr.brand-row")]

    assert "status=failed" in browser.current_url
    assert failed == ["demo-07", "demo-09"]

    follow(browser, browser.find_element(By.LINK_TEXT, "demo-09"))
    timeline = _cells(browser, "tr.timeline-row")
    # An attempt's row: time, after, event, ...; a brand's own: time, event, what it said.
    events = [row[2] if len(row) > 3 else row[1] for row in timeline]
    first = browser.find_element(By.CSS_SELECTOR, ".attempt h3").text

    assert browser.find_element(By.ID, "brand-status").text == "failed"
    assert events[-1] == "brand: Registered"  # newest first: the current attempt on top
    assert "current" in first
    assert "failed: exhausted" in first
    assert "Started" in events
    assert "CreateRequested" in events
    assert any(row[0] and row[0][:4].isdigit() for row in timeline)  # each row has its time
    assert any(row[1].startswith("+") for row in timeline if len(row) > 3)  # and its wait
    assert browser.find_element(By.ID, "why-reason").text == "exhausted"
    assert "provisioner retry --failed" in browser.find_element(By.ID, "why-advice").text

    browser.get(site + "/")
    follow(browser, browser.find_element(By.LINK_TEXT, "demo-deferred"))
    rows = _cells(browser, "tr.timeline-row.deferred")
    heading = browser.find_element(By.CSS_SELECTOR, ".attempt h3").text

    assert len(rows) == 1  # the two deferrals, folded into one row as `history` folds them
    assert rows[0][2].startswith("deferred ×2, from 20")
    assert " to 20" in rows[0][2]
    assert rows[0][5].startswith("deferred ×2: gateway unavailable: ")
    assert "settle hops 0 of 5" in heading
    assert "deferred ×2" in heading
    assert browser.find_element(By.ID, "why-step").text.startswith("hop 1 of 6 (hop #2 in all)")
    assert browser.find_element(By.ID, "why-budget").text == "5 settle hop(s)"
    assert browser.find_element(By.ID, "why-deferral").text.startswith("deferred ×2: gateway")

    browser.get(site + "/")
    follow(browser, browser.find_element(By.LINK_TEXT, "demo-09"))
    shot = Path(SCREENSHOT_TO) if SCREENSHOT_TO else tmp_path / "web-brand.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000  # a page was drawn, not a blank


def test_a_person_searches_brands_by_failure_reason_and_time(
    site: str, browser: webdriver.Chrome
) -> None:
    browser.get(site + "/")
    Select(browser.find_element(By.ID, "reason")).select_by_value("exhausted")
    browser.find_element(By.ID, "since").send_keys("1d")
    follow(browser, browser.find_element(By.ID, "filter"))
    found = [row[0] for row in _cells(browser, "tr.brand-row")]
    kept = browser.find_element(By.ID, "since").get_attribute("value")

    assert "reason=exhausted" in browser.current_url
    assert found == ["demo-07", "demo-09"]
    assert kept == "1d"  # the form keeps what was asked

    browser.find_element(By.ID, "until").send_keys("2000-01-01T00:00:00Z")
    follow(browser, browser.find_element(By.ID, "filter"))
    assert _cells(browser, "tr.brand-row") == []
    assert "no brand matches" in browser.find_element(By.ID, "brands").text


def test_a_person_follows_links_from_brand_to_attempt_to_workspace(
    site: str, browser: webdriver.Chrome
) -> None:
    browser.get(site + "/")
    counts = browser.find_element(By.ID, "counts").text
    reasons = {row[0]: row[3] for row in _cells(browser, "tr.brand-row")}

    assert "failed 2" in counts
    assert "ready 10" in counts
    assert reasons["demo-09"] == "exhausted"
    assert reasons["demo-01"] == ""

    follow(browser, browser.find_element(By.LINK_TEXT, "demo-07"))
    follow(browser, browser.find_element(By.CSS_SELECTOR, ".links a.attempt-link"))
    strip = browser.find_element(By.CSS_SELECTOR, ".strip svg")

    assert browser.title.startswith("Attempt ")
    assert browser.find_element(By.ID, "attempt-state").text == "failed"
    assert strip.is_displayed()
    assert strip.size["width"] > 300  # drawn, not collapsed
    # The zombie's create waits once without asking (decision 049), drawn hollow: that
    # wait spends no settle budget; then five "not ready" answers spend it.
    assert len(browser.find_elements(By.CSS_SELECTOR, ".strip circle.mark-wait")) == 1
    assert len(browser.find_elements(By.CSS_SELECTOR, ".strip circle.mark-hop")) == 5
    hollow = browser.find_element(By.CSS_SELECTOR, ".strip circle.mark-wait")
    assert hollow.value_of_css_property("fill") == "rgb(255, 255, 255)"  # the stylesheet's
    caption = browser.find_element(By.CSS_SELECTOR, ".strip figcaption").text
    assert "over" in caption
    assert caption.endswith("a hollow mark is a wait that spent no settle budget")

    follow(browser, browser.find_element(By.CSS_SELECTOR, "p a.workspace-link"))
    assert browser.title.startswith("Workspace ws-")
    attempts = _cells(browser, "#workspace-attempts tbody tr")
    assert [row[1] for row in attempts] == ["demo-07"]

    follow(browser, browser.find_element(By.CSS_SELECTOR, "#workspace-attempts a.brand-link"))
    assert browser.find_element(By.ID, "brand-id").text == "demo-07"


def test_a_person_pages_filters_and_refreshes(site: str, browser: webdriver.Chrome) -> None:
    browser.get(site + "/?status=faild")
    refused = browser.find_element(By.ID, "message").text
    browser.get(site + "/health")
    checks = {row[0]: row[1] for row in _cells(browser, "tr.check-row")}
    circuit = browser.find_element(By.ID, "circuit").text
    browser.get(site + "/")
    follow(browser, browser.find_element(By.LINK_TEXT, "reload every 10 s"))
    refreshing = browser.find_element(By.ID, "refresh").text

    assert refused.startswith("unknown status 'faild': one of ready,")
    assert checks["database"] == "ok"
    assert "No circuit to show" in circuit
    assert "refresh=10" in browser.current_url
    assert refreshing.startswith("reloads every 10 s")


def test_the_other_pages_say_what_they_hold(site: str, browser: webdriver.Chrome) -> None:
    browser.get(site + "/lag")
    projections = {row[0]: row for row in _cells(browser, "#projections tbody tr")}
    browser.get(site + "/dead-letters")
    notice = browser.find_element(By.ID, "notice").text
    browser.get(site + "/stuck?overdue=0")
    stuck = [row[1] for row in _cells(browser, "#stuck tbody tr")]

    assert set(projections) == {"brand_workspaces", "attempts"}
    assert projections["brand_workspaces"][4] == "0"  # events behind
    assert "embedded broker" in notice
    assert stuck == ["<script>alert(1)</script>"]


def test_a_person_sees_each_worker_alive_or_silent(site: str, browser: webdriver.Chrome) -> None:
    browser.get(site + "/")
    follow(browser, browser.find_element(By.LINK_TEXT, "Workers"))
    rows = _cells(browser, "#workers tbody tr")
    alive = browser.find_element(By.ID, "alive").text

    assert browser.title.startswith("Workers")
    assert alive == "2 of 3 alive"
    by_state = {(row[0], row[8]): row for row in rows}
    assert set(by_state) == {("relay", "alive"), ("worker", "alive"), ("worker", "silent")}
    worker = by_state[("worker", "alive")]
    assert worker[1:8] == [socket.gethostname(), str(os.getpid()), worker[3], "16", "3",
                           "1200", "0 s ago"]  # fmt: skip
    assert worker[3]  # the package version
    assert worker[9].endswith(" s ago")  # the gateway's last answer, seconds back
    silent = by_state[("worker", "silent")]
    assert silent[1] == HOSTILE_HOST  # markup shown as text
    assert (silent[2], silent[4], silent[7], silent[9]) == ("41", "4", "10 min ago", "")
    relay = by_state[("relay", "alive")]
    assert relay[4:7] == ["", "", ""]  # threads, in flight, handled: a worker's


def test_a_person_reads_an_audit_finding_and_follows_it_to_the_brand(
    site: str, browser: webdriver.Chrome
) -> None:
    browser.get(site + "/")
    follow(browser, browser.find_element(By.LINK_TEXT, "Audit"))
    when = browser.find_element(By.CSS_SELECTOR, ".audit .audit-when").text
    [finding] = _cells(browser, "tr.finding-row")

    assert browser.find_element(By.CSS_SELECTOR, ".audit h2").text == "org-parent"
    assert when.startswith("Audited at 20")
    assert when.endswith("UTC: 1 finding(s), 1 problem(s).")
    assert finding[:3] == ["orphan", "ws-orphan", HOSTILE_ID]  # markup shown as text
    assert finding[4] == "made by an unresolved create"
    assert finding[5] == "title Bold & Co · status ready · projects 0 · action release"

    follow(browser, browser.find_element(By.CSS_SELECTOR, "tr.finding-row a.brand-link"))
    assert browser.find_element(By.ID, "brand-id").text == HOSTILE_ID


def test_the_pages_are_styled_under_their_content_security_policy(
    site: str, browser: webdriver.Chrome
) -> None:
    """The stylesheet loads and applies, and the browser blocks nothing the pages use."""
    browser.get_log("browser")  # what earlier tests left
    for path in ("/", "/brands/demo-09", "/stuck", "/lag", "/dead-letters", "/nowhere",
                 "/health", "/?status=nope", "/audit", "/workers"):  # fmt: skip
        browser.get(site + path)
        header = browser.find_element(By.TAG_NAME, "header")
        assert header.value_of_css_property("background-color") == "rgba(29, 35, 48, 1)", path
    blocked = [
        e["message"] for e in browser.get_log("browser") if "Content Security" in e["message"]
    ]
    assert blocked == []
