"""The web view's pages through Starlette's TestClient (no socket): what each shows,
escaping, the bearer token, 404s, the brand filters, the security headers, the Host
check and the refusal to serve open beyond loopback."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from domain.upstream_audit import Action, Audit, Finding, Kind
from infrastructure.broker.publisher import Broker
from infrastructure.broker.topology import WORK_KEY, Topology
from infrastructure.settings.model import Settings, log_secrets
from infrastructure.settings.parsing import SettingsError
from infrastructure.views.audit_findings import FindingsWriter
from tests.integration.web_fixture import DEFERRED_ID, HOSTILE_ID, HOSTILE_TITLE, filled_store
from worker.cli.main import main
from worker.web.app import create_app
from worker.web.guard import check_bind


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return filled_store(tmp_path_factory.mktemp("web"))


# The address the pages are served at by default: the Host every request names.
BASE = "http://127.0.0.1:8080"


def client(database_url: str, **env: str) -> TestClient:
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": database_url, **env})
    return TestClient(create_app(settings), base_url=BASE)


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
    assert "15 of 15 brand(s) shown" in page.text
    assert 'id="next-page"' not in page.text


def _counts(text: str) -> dict[str, int]:
    found = re.findall(r'href="\?status=(\w+)">\w+ <strong>(\d+)</strong>', text)
    return {status: int(n) for status, n in found}


def test_the_brand_list_counts_each_status_and_names_the_failures(web: TestClient) -> None:
    text = web.get("/").text
    failed = web.get("/", params={"status": "failed"}).text
    reasons = re.findall(r'<td class="reason">([^<]*)</td>', failed)

    assert _counts(text) == {"ready": 10, "degraded": 0, "pending": 2, "failed": 2,
                             "cancelled": 0, "none": 0, "deactivated": 1}  # fmt: skip
    assert _counts(failed) == _counts(text)  # of every brand, whatever the filter
    assert reasons == ["exhausted", "exhausted"]
    assert re.search(r'href="/workspaces/ws-[0-9a-f-]+"', text)  # a bound brand's workspace
    assert re.search(r'href="/attempts/[0-9a-f-]{36}">[0-9a-f-]{36}</a> \(promoted\)', text)


def test_an_unknown_filter_value_is_refused_with_what_it_may_be(web: TestClient) -> None:
    refused = web.get("/", params={"status": "faild"})

    assert refused.status_code == 400
    assert "unknown status &#39;faild&#39;: one of ready, degraded, pending, failed" in refused.text
    assert 'class="brand-row"' not in refused.text


def test_the_brand_list_pages_through_every_brand(
    web: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.web.reads.BRANDS_SHOWN", 4)
    seen: list[str] = []
    pages = 0
    url: str | None = "/?q=demo"
    while url is not None:
        text = web.get(url).text
        pages += 1
        seen += re.findall(r'class="brand-link" href="/brands/[^"]+">([^<]+)</a>', text)
        after = re.search(r'id="next-page" href="([^"]+)"', text)
        url = "/" + after.group(1).replace("&amp;", "&") if after else None
        assert pages < 10

    assert pages == 4  # 14 brands match "demo": 4 + 4 + 4 + 2
    assert seen == sorted(seen)
    assert len(seen) == len(set(seen)) == 14
    assert DEFERRED_ID in seen


def test_auto_refresh_is_asked_for_and_bounded(web: TestClient) -> None:
    fresh = web.get("/", params={"refresh": "10"})
    plain = web.get("/")
    too_fast = web.get("/lag", params={"refresh": "1"})
    junk = web.get("/lag", params={"refresh": "soon"})

    assert '<meta http-equiv="refresh" content="10">' in fresh.text
    filtered = web.get("/", params={"status": "failed"}).text
    assert 'href="?status=failed&amp;refresh=10">reload every 10 s' in filtered  # keeps the filter
    assert 'href="?status=failed">stop' in web.get("/?status=failed&refresh=10").text
    assert "reloads every 10 s" in fresh.text
    assert "http-equiv" not in plain.text
    assert (too_fast.status_code, junk.status_code) == (400, 400)
    assert "from 5 to 3600" in too_fast.text


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


def test_brands_are_found_by_failure_reason_and_by_when_they_changed(web: TestClient) -> None:
    exhausted = web.get("/", params={"reason": "exhausted"}).text
    recent = web.get("/", params={"reason": "exhausted", "since": "1h", "until": "now"}).text
    long_ago = web.get("/", params={"until": "2000-01-01T00:00:00Z"}).text
    other = web.get("/", params={"reason": "deadline"}).text
    bad_reason = web.get("/", params={"reason": "tired"})
    bad_time = web.get("/", params={"since": "yesterday"})

    names = re.findall(r'class="brand-link" href="/brands/[^"]+">([^<]+)</a>', recent)
    assert names == ["demo-07", "demo-09"]
    assert exhausted.count('class="brand-row"') == 2
    assert "no brand matches" in long_ago
    assert "no brand matches" in other
    assert '<option value="exhausted" selected>' in exhausted  # the form keeps the choice
    assert 'name="since" id="since" value="1h"' in recent
    assert (bad_reason.status_code, bad_time.status_code) == (400, 400)
    assert "unknown reason &#39;tired&#39;: one of " in bad_reason.text
    assert "is not a time: use ISO 8601" in bad_time.text


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


def _attempt_of(web: TestClient, brand_id: str) -> str:
    """The brand's current attempt, as its page links it."""
    link = r'current attempt <a class="mono attempt-link" href="/attempts/([0-9a-f-]{36})"'
    found = re.search(link, web.get(f"/brands/{brand_id}").text)
    assert found is not None
    return found.group(1)


def test_a_brand_page_shows_each_attempt_as_a_timeline(web: TestClient) -> None:
    failed = web.get("/brands/demo-09").text
    deactivated = web.get("/brands/demo-13").text

    assert 'id="brand-status" class="status status-failed">failed<' in failed
    assert "CreateRequested" in failed
    assert "exhausted" in failed  # the failure's reason
    assert "brand: Registered" in failed
    assert "brand: Deactivated" in deactivated
    assert "cancelled" in deactivated


def test_the_current_attempt_comes_first_with_why_and_what_next(web: TestClient) -> None:
    text = web.get(f"/brands/{DEFERRED_ID}").text
    failed = web.get("/brands/demo-09").text

    assert text.index('class="attempt current"') < text.index("brand: Registered")
    assert '<dd id="why-reason">deferred</dd>' in text
    at = r"(?:\d{4}-\d{2}-\d{2} )?[0-9:]{8}"  # with its date when not today's (near midnight)
    assert re.search(rf'id="why-step">hop 1 of 6 \(hop #2 in all\), next at {at}, '
                     rf"fails after {at} unless confirmed<", text)  # fmt: skip
    assert '<dd id="why-budget">5 settle hop(s)</dd>' in text
    assert 'id="why-deferral" class="owed">deferred ×2: gateway unavailable' in text
    assert '<dd id="why-reason">exhausted</dd>' in failed
    assert "then `provisioner retry --failed` starts a fresh attempt" in failed
    assert re.search(r'<td class="after">\+[0-9.]+ (ms|s)</td>', failed)  # time since the last
    assert failed.count('<figure class="strip">') == 1  # each attempt's hops, drawn
    assert failed.index("<td>Failed</td>") < failed.index("<td>Started</td>")  # newest first
    assert '<circle class="mark mark-next"' in text  # the pending one's next hop


def test_an_attempt_page_shows_its_hops_on_a_strip_and_links_back(web: TestClient) -> None:
    attempt = _attempt_of(web, "demo-09")
    page = web.get(f"/attempts/{attempt}")
    deferred = web.get(f"/attempts/{_attempt_of(web, DEFERRED_ID)}").text

    assert page.status_code == 200
    assert '<a class="brand-link" href="/brands/demo-09">demo-09</a>' in page.text
    assert "failed (exhausted): not confirmed after 6 answered hops" in page.text
    # Every create fails: 6 creates, each followed by a wait that spends no settle budget
    # (the next hop polls it; drawn hollow), and 5 polls answering "creation_failed" that
    # each spend a settle wait; the 6th such poll finds the budget spent.
    assert page.text.count('<circle class="mark mark-create"') == 6
    assert page.text.count('<circle class="mark mark-wait"') == 6
    assert page.text.count('<circle class="mark mark-hop"') == 5
    assert page.text.count('<circle class="mark mark-failed"') == 1
    assert '<circle class="mark mark-next"' not in page.text  # it ended: no next hop
    assert re.search(r'href="/workspaces/ws-[0-9a-f-]+"', page.text)  # what its creates made
    assert "a hollow mark is a wait that spent no settle budget" in page.text
    assert '<rect class="mark-deferred"' in deferred
    assert '<circle class="mark mark-next"' in deferred
    # Deferred before any create: no wait that spent nothing, and no word of one.
    assert '<circle class="mark mark-wait"' not in deferred
    assert "a hollow mark" not in deferred
    assert 'id="why-deferral"' in deferred


def test_a_workspace_page_names_its_brand_claim_and_attempts(web: TestClient) -> None:
    brand = web.get("/brands/demo-01").text
    workspace = re.search(r'href="/workspaces/(ws-[0-9a-f-]+)"', brand)
    assert workspace is not None
    page = web.get(f"/workspaces/{workspace.group(1)}").text
    unknown = web.get("/workspaces/ws-never_seen").text

    assert 'Bound to brand <a class="brand-link" href="/brands/demo-01">demo-01</a>' in page
    assert 'Claimed by brand <a class="brand-link" href="/brands/demo-01">' in page
    assert "candidate (created)" in page
    assert "Bound to no brand." in unknown
    assert "no attempt had it" in unknown  # `_` is no wildcard


def test_the_health_page_shows_every_check_and_the_circuit(web: TestClient) -> None:
    text = web.get("/health").text
    checks = re.findall(r'<tr class="check-row"><td>(\w+)</td>', text)

    assert "database" in checks
    assert "stuck_attempts" in checks
    assert 'id="circuit">No circuit to show' in text  # SQLite holds no pace


def test_an_unknown_brand_or_page_is_404(web: TestClient) -> None:
    brand = web.get("/brands/no-such-brand")
    page = web.get("/nowhere")

    assert brand.status_code == 404
    assert "no brand &#39;no-such-brand&#39; is registered" in brand.text
    assert page.status_code == 404
    not_uuid = web.get("/attempts/not-a-uuid")
    no_attempt = web.get("/attempts/00000000-0000-4000-8000-000000000000")
    assert (not_uuid.status_code, no_attempt.status_code) == (404, 404)
    assert "is not an attempt id (a UUID)" in not_uuid.text
    assert "no attempt 00000000-0000-4000-8000-000000000000 exists" in no_attempt.text


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


def _section(text: str, parent: str) -> str:
    found = re.search(rf'<h2 class="mono">{parent}</h2>(.*?)</section>', text, re.DOTALL)
    assert found, parent
    return found.group(1)


@pytest.mark.postgres
def test_the_audit_page_shows_each_parents_last_findings_escaped(pg_database: str) -> None:
    tag = uuid.uuid4().hex[:8]
    dirty, clean, never = f"org-dirty-{tag}", f"org-clean-{tag}", f"org-never-{tag}"
    attempt = str(uuid.uuid4())
    orphan = Finding(Kind.ORPHAN, dirty, "ws-<i>1</i>", "made by <b>attempt</b>", HOSTILE_TITLE,
                     (HOSTILE_ID,), attempt, status="ready", projects=2,
                     action=Action.RELEASE)  # fmt: skip
    foreign = Finding(Kind.FOREIGN, dirty, "ws-2", "someone else's", "Co", status="ready")
    at = 1_900_000_000.0
    shown = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    writer = FindingsWriter(pg_database, clock=lambda: at)
    assert writer.write([Audit(dirty, (orphan, foreign), {}), Audit(clean, (), {})])

    with client(pg_database, PROVISIONER_PARENT_IDS=f"{dirty},{never}") as web:
        page = web.get("/audit")
    found = _section(page.text, dirty)
    rows = re.findall(r'<tr class="finding-row">(.*?)</tr>', found, re.DOTALL)

    assert page.status_code == 200
    assert 'href="/audit" class="here">Audit</a>' in page.text
    assert f"Audited at {shown} UTC: 2 finding(s), <strong>1</strong> problem(s)." in found
    assert len(rows) == 2
    assert '<span class="status status-failed">orphan</span>' in rows[0]
    assert 'href="/workspaces/ws-%3Ci%3E1%3C/i%3E">ws-&lt;i&gt;1&lt;/i&gt;</a>' in rows[0]
    assert ('href="/brands/%3Cscript%3Ealert%281%29%3C/script%3E">'
            "&lt;script&gt;alert(1)&lt;/script&gt;</a>") in rows[0]  # fmt: skip
    assert f'href="/attempts/{attempt}">{attempt}</a>' in rows[0]
    assert "made by &lt;b&gt;attempt&lt;/b&gt;" in rows[0]
    assert ("title &lt;b&gt;Bold &amp; Co&lt;/b&gt; · status ready · projects 2 · "
            "action release") in rows[0]  # fmt: skip
    assert '<span class="status status-cancelled">foreign</span>' in rows[1]
    assert HOSTILE_ID not in page.text
    assert HOSTILE_TITLE not in page.text
    assert f'<span class="status status-ready">clean</span> at {shown} UTC' in _section(
        page.text, clean
    )
    assert "no audit recorded yet" in _section(page.text, never)  # configured, not audited


def test_the_audit_page_says_when_no_audit_was_recorded(web: TestClient) -> None:
    page = web.get("/audit")

    assert page.status_code == 200
    assert 'id="no-audit">no audit recorded yet' in page.text
    assert 'class="finding-row"' not in page.text


def test_an_unreachable_store_or_broker_is_said_in_one_line(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {
            "PROVISIONER_DATABASE_URL": f"sqlite:///{tmp_path / 'none.sqlite'}",
            "PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:1/",
        }
    )
    with TestClient(create_app(settings), base_url=BASE, raise_server_exceptions=False) as web:
        brands = web.get("/")
        dead = web.get("/dead-letters")

    assert brands.status_code == 503
    assert "no event store at" in brands.text
    assert dead.status_code == 200
    assert "is unavailable" in dead.text
    assert "guest:guest" not in dead.text
    for answer in (brands, dead):  # a 503 comes from Starlette's error handler: headers too
        assert_secured(answer)


def test_with_a_token_every_page_needs_it(database_url: str) -> None:
    with client(database_url, PROVISIONER_WEB_TOKEN="s3cret-token") as web:
        for path in ("/", "/brands/demo-01", "/stuck", "/lag", "/dead-letters", "/nowhere",
                     "/health", "/attempts/x", "/workspaces/x", "/dead-letters/x"):  # fmt: skip
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


# --------------------------------------------------------------------------- exposure


def assert_secured(answer: Any) -> None:
    csp = answer.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "style-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "same-origin"  # a form's POST sends its Origin


PAGES = ("/", "/brands/demo-01", "/brands/no-such-brand", "/stuck", "/lag", "/dead-letters",
         "/nowhere", "/style.css", "/health", "/?status=nope", "/attempts/not-a-uuid",
         "/dead-letters/abc")  # fmt: skip


def test_every_answer_carries_the_security_headers(web: TestClient, database_url: str) -> None:
    for path in PAGES:
        assert_secured(web.get(path))
    assert web.get("/nowhere").status_code == 404
    with client(database_url, PROVISIONER_WEB_TOKEN="s3cret-token") as guarded:
        for path in PAGES:
            refused = guarded.get(path)
            assert refused.status_code == 401
            assert_secured(refused)
    assert_secured(web.get("/", headers={"Host": "evil.example"}))


def test_the_pages_have_no_inline_style_or_script_and_load_their_stylesheet(
    web: TestClient,
) -> None:
    sheet = web.get("/style.css")
    assert sheet.status_code == 200
    assert sheet.headers["content-type"].startswith("text/css")
    assert "font-family" in sheet.text
    attempt = _attempt_of(web, "demo-09")
    for path in ("/", "/brands/demo-09", "/stuck", "/lag", "/dead-letters", "/nowhere",
                 f"/attempts/{attempt}", "/workspaces/ws-none", "/health"):  # fmt: skip
        text = web.get(path).text
        assert '<link rel="stylesheet" href="/style.css">' in text
        for inline in ("<style", "<script", "style=", "onclick", "http-equiv"):
            assert inline not in text, (path, inline)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", "gw.internal:8080",
     "provisioner.example", "provisioner.example:443"],
)  # fmt: skip
def test_the_bound_host_loopback_names_and_allowed_hosts_are_served(
    database_url: str, host: str
) -> None:
    allowed = "provisioner.example,gw.internal:8080"
    with client(database_url, PROVISIONER_WEB_ALLOWED_HOSTS=allowed) as web:
        assert web.get("/lag", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8080", "127.0.0.1:9999", "localhost", "gw.internal:9090",
     "127.0.0.1.evil.example:8080", "", "a b", "[::1", "user@127.0.0.1:8080"],
)  # fmt: skip
def test_any_other_host_is_refused_before_anything_is_read(database_url: str, host: str) -> None:
    """DNS rebinding: a hostile page whose name now resolves to 127.0.0.1 is refused,
    with a token set or not; the refusal is one line."""
    allowed = "provisioner.example,gw.internal:8080"
    for token in ({}, {"PROVISIONER_WEB_TOKEN": "s3cret-token"}):
        with client(database_url, PROVISIONER_WEB_ALLOWED_HOSTS=allowed, **token) as web:
            refused = web.get("/", headers={"Host": host, "Authorization": "Bearer s3cret-token"})
        assert refused.status_code == 400
        assert "does not answer to the name" in refused.text
        assert "\n" not in refused.text.strip()
        assert "demo-01" not in refused.text


def test_a_host_bound_by_name_or_on_every_interface_answers_to_its_own_name(
    database_url: str,
) -> None:
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": database_url})
    named = TestClient(create_app(settings, host="box.lan", port=9000), base_url=BASE)
    wildcard = TestClient(create_app(settings, host="0.0.0.0", port=9000), base_url=BASE)
    with named, wildcard:
        assert named.get("/lag", headers={"Host": "box.lan:9000"}).status_code == 200
        assert named.get("/lag", headers={"Host": "localhost:9000"}).status_code == 200
        assert named.get("/lag", headers={"Host": "box.lan:8080"}).status_code == 400
        # 0.0.0.0 is no name a browser uses: the machine's own names must be allowed
        assert wildcard.get("/lag", headers={"Host": "box.lan:9000"}).status_code == 400
        assert wildcard.get("/lag", headers={"Host": "127.0.0.1:9000"}).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "box.lan"])
def test_serving_off_loopback_needs_a_token_or_the_open_opt_in(
    host: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    served: list[tuple[str, int]] = []
    monkeypatch.setattr(
        "worker.web.app.uvicorn.run", lambda app, host, port, **_: served.append((host, port))
    )
    for key in ("PROVISIONER_WEB_TOKEN", "PROVISIONER_WEB_ALLOW_OPEN", "PROVISIONER_WEB_HOST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PROVISIONER_DATABASE_URL", "memory://")

    refused = CliRunner().invoke(main, ["web", "--host", host, "--port", "8181"])
    assert refused.exit_code == 3, refused.output
    line = refused.output.strip()
    assert "\n" not in line
    assert f"would serve {host} without PROVISIONER_WEB_TOKEN" in line
    assert "PROVISIONER_WEB_ALLOW_OPEN=1" in line
    assert served == []

    monkeypatch.setenv("PROVISIONER_WEB_TOKEN", "s3cret-token")
    assert CliRunner().invoke(main, ["web", "--host", host]).exit_code == 0
    monkeypatch.delenv("PROVISIONER_WEB_TOKEN")
    monkeypatch.setenv("PROVISIONER_WEB_ALLOW_OPEN", "1")
    with caplog.at_level(logging.WARNING, logger="provisioner.web"):
        assert CliRunner().invoke(main, ["web", "--host", host]).exit_code == 0
    assert "without a token" in caplog.text
    assert served == [(host, 8080), (host, 8080)]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_is_served_open_without_a_word(host: str) -> None:
    check_bind(Settings.from_env({}), host)  # no ConfigurationError


@pytest.mark.parametrize(("host", "shown"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")])
def test_the_command_says_where_it_listens(
    host: str, shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[int] = []
    monkeypatch.setattr(
        "worker.web.app.uvicorn.run", lambda app, host, port, **_: served.append(port)
    )
    for key in ("PROVISIONER_WEB_TOKEN", "PROVISIONER_WEB_ALLOW_OPEN", "PROVISIONER_WEB_HOST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PROVISIONER_DATABASE_URL", "memory://")

    result = CliRunner().invoke(main, ["web", "--host", host, "--port", "8181"])

    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"listening on http://{shown}:8181"
    assert served == [8181]


@pytest.mark.rabbitmq
def test_a_dead_letters_body_and_headers_are_shown_escaped(
    database_url: str, rabbit_url: str
) -> None:
    broker = Broker(rabbit_url, Topology(), scheduler=None)
    try:
        broker.declare()
        broker.publish_dead(b'{"brand": "<img src=x>"}', "schema errors", {"hop": "missing"},
                            WORK_KEY)  # fmt: skip
    finally:
        broker.close()
    with client(database_url, PROVISIONER_BROKER_URL=rabbit_url) as web:
        listing = web.get("/dead-letters").text
        linked = re.search(r'class="letter-link" href="/dead-letters/([^"]+)"', listing)
        assert linked is not None
        page = web.get(f"/dead-letters/{linked.group(1)}")
        gone = web.get("/dead-letters/zzzzzzzzzzzzzzzz")

    assert page.status_code == 200
    assert '<pre id="body">{&#34;brand&#34;: &#34;&lt;img src=x&gt;&#34;}</pre>' in page.text
    assert '<td class="mono">x-dead-source</td>' in page.text
    assert "hop: missing" in page.text  # its errors
    assert "<img" not in page.text
    assert gone.status_code == 404
