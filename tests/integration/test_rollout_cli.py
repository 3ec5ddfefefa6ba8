"""`provisioner rollout` and `provisioner retry --failed` against PostgreSQL and
RabbitMQ: the messages they publish are what a worker turns into attempts, a
second run of the same file starts nothing, bad lines are reported by number,
and a redrive re-requests failed brands only.

The worker, the relay and the projections run on threads of this process, as
`provisioner run` runs them; the commands run through click's runner. Brands
and titles are this test's own (the session shares one database), and `retry`
is limited to attempts that ended since the test began.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from infrastructure.broker.messages import decode
from infrastructure.broker.topology import COMMANDS_QUEUE
from infrastructure.fake_gateway.server import FakeGateway
from infrastructure.settings.model import Settings
from infrastructure.views.queries import brand_workspace, list_attempts
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT
from tests.integration.messaging_support import (
    Running,
    components,
    environment,
    queue_depth,
    raw,
    take,
    title_of,
    wait_for,
)
from worker.cli.main import main
from worker.rollout_input import ROLLOUT_MAX_BYTES
from worker.runtime import Runtime, build

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def env(pg_database: str, rabbit_url: str, fake: FakeGateway) -> dict[str, str]:
    return environment(pg_database, rabbit_url, fake)


@contextmanager
def provisioner_run(env: dict[str, str]) -> Iterator[tuple[Runtime, Running]]:
    """Worker, relay and projections on threads, as `provisioner run` has them."""
    with build(Settings.from_env(env)) as runtime:
        # The relay first: it starts at the log's head, before the worker saves anything.
        with components(runtime, worker=False, relay=True), components(runtime) as running:
            projector = runtime.start(runtime.projector(500).run, "projections", running.stop)
            try:
                yield runtime, running
            finally:
                running.stop.set()
                projector.join(20)
        assert not projector.is_alive()
        assert not runtime.failures, runtime.failures


def invoke(env: dict[str, str], *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, input=stdin)


def report(result: Result) -> dict[str, Any]:
    assert result.stdout.strip(), result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def brands(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"rollout-{tag}-{i}" for i in range(n)]


def csv_file(path: Path, brand_ids: list[str]) -> Path:
    rows = [f"{b},{title_of(b)},{PARENT}" for b in brand_ids]
    path.write_text("\n".join(["brand_id,title,parent", *rows]) + "\n")
    return path


def attempts_of(url: str, brand_id: str) -> list[dict[str, Any]]:
    with SqlViewStore(url) as store:
        return list_attempts(store, brand_id=brand_id)


def status_of(url: str, brand_id: str) -> str | None:
    with SqlViewStore(url) as store:
        row = brand_workspace(store, brand_id)
    return None if row is None else str(row["status"])


def test_a_rollout_becomes_attempts_and_running_it_again_starts_nothing(
    env: dict[str, str], pg_database: str, tmp_path: Path
) -> None:
    brand_ids = brands(4)
    path = csv_file(tmp_path / "brands.csv", brand_ids)
    with provisioner_run(env) as (_, running):
        assert running.worker is not None
        first = invoke(env, "rollout", str(path), "--wait", "--timeout", "60", "--json")
        provisions = running.worker.stats.by_type.get("provision", 0)
        again = invoke(env, "rollout", str(path))
        text = invoke(env, "rollout", str(path), "--wait", "--timeout", "5")
        after = running.worker.stats.by_type.get("provision", 0)

    assert first.exit_code == 0, first.output
    done = report(first)
    assert done["format"] == "csv"
    assert sorted(done["sent"]) == sorted(brand_ids)
    assert done["counts"] == {
        "lines": 4, "sent": 4, "skipped": 0, "bad": 0,
        "ready": 4, "failed": 0, "pending": 0, "other": 0,
    }  # fmt: skip
    assert done["wait"]["timed_out"] is False
    assert "sent 4 of 4" in first.stderr  # plain counts: not a terminal
    assert provisions == 4
    for brand_id in brand_ids:
        [attempt] = attempts_of(pg_database, brand_id)
        assert attempt["state"] == "promoted"
        assert attempt["title"] == title_of(brand_id)

    # The second run: every brand skipped as ready, nothing published, nothing started.
    assert again.exit_code == 0, again.output
    assert "0 sent, 4 skipped (4 already ready:" in again.stdout
    assert text.exit_code == 0, text.output
    assert "Nothing to wait for." in text.stdout
    assert after == provisions
    assert all(len(attempts_of(pg_database, b)) == 1 for b in brand_ids)


def test_bad_lines_are_reported_by_number_and_the_good_ones_published(
    env: dict[str, str], rabbit_url: str
) -> None:
    good, missing, twice = brands(3)
    lines = [
        json.dumps({"brand_id": good, "title": title_of(good), "parent": PARENT}),
        json.dumps({"brand_id": missing, "parent": PARENT}),
        "",
        "{not json",
        json.dumps({"brand_id": twice, "title": "One", "parent": PARENT}),
        json.dumps({"brand_id": twice, "title": "Two", "parent": PARENT}),
        json.dumps({"brand_id": "x" * 201, "title": "Long", "parent": PARENT}),
    ]
    before = datetime.now(UTC)
    result = invoke(env, "rollout", "-", stdin="\n".join(lines) + "\n")  # no worker runs
    published = take(rabbit_url, COMMANDS_QUEUE, 2, timeout=2.0)

    assert result.exit_code == 1, result.output
    assert "line 2: missing title" in result.stderr
    assert "line 4: invalid JSON" in result.stderr
    assert f"line 5: brand_id '{twice}' is on line(s) 6 too" in result.stderr
    assert f"line 6: brand_id '{twice}' is on line(s) 5 too" in result.stderr
    assert "line 7: refused by the message schema: brand_id:" in result.stderr
    assert "stdin (jsonl, 6 lines): 1 sent" in result.stdout
    assert "5 bad lines (lines 2, 4, 5, 6, 7, not sent)" in result.stdout
    [message] = [decode(raw(m.body), content_type=m.content_type) for m in published]
    assert message.type == "provision"
    fields = message.fields
    assert (fields["brand_id"], fields["title"], fields["parent_workspace_id"]) == (
        good, title_of(good), PARENT,
    )  # fmt: skip
    assert before <= fields["requested_at"] <= datetime.now(UTC)


def test_the_embedded_broker_is_refused_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    path = csv_file(tmp_path / "brands.csv", brands(1))
    embedded = env | {"PROVISIONER_BROKER_URL": "memory://"}

    result = invoke(embedded, "rollout", str(path))
    redrive = invoke(embedded, "retry", "--failed")
    usage = invoke(env, "retry")

    assert result.exit_code == 3, result.output
    assert "set PROVISIONER_BROKER_URL" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert redrive.exit_code == 3, redrive.output
    assert usage.exit_code == 2
    assert "--failed" in usage.output


def test_retry_failed_lists_then_re_requests_the_failed_brand_and_skips_the_ready_one(
    env: dict[str, str], pg_database: str, rabbit_url: str, fake: FakeGateway, tmp_path: Path
) -> None:
    healed, failed = brands(2)
    since = datetime.now(UTC).isoformat()
    both = csv_file(tmp_path / "both.csv", [healed, failed])
    one = csv_file(tmp_path / "one.csv", [healed])
    with provisioner_run(env):
        fake.configure(unauthorized_rate=1.0)  # every call refused: both attempts fail
        refused = invoke(env, "rollout", str(both), "--wait", "--timeout", "60", "--json")
        fake.configure(unauthorized_rate=0.0)
        healing = invoke(env, "rollout", str(one), "--wait", "--timeout", "60")
    first_attempt = attempts_of(pg_database, failed)[0]["attempt_id"]

    # Nothing consumes now: what a command publishes stays on the queue.
    selected = ("retry", "--failed", "--since", since, "--reason", "unauthorized")
    dry = invoke(env, *selected, "--dry-run", "--json")
    dry_depth = queue_depth(rabbit_url, COMMANDS_QUEUE)[0]
    done = invoke(env, *selected)
    depth = queue_depth(rabbit_url, COMMANDS_QUEUE)[0]
    other_reason = invoke(env, "retry", "--failed", "--since", since, "--reason", "exhausted")
    with provisioner_run(env):
        wait_for(lambda: status_of(pg_database, failed) == "ready", f"{failed} ready", 30)
    again = invoke(env, *selected, "--json")

    assert refused.exit_code == 1, refused.output
    wait = report(refused)["wait"]
    assert sorted(f["brand_id"] for f in wait["failed"]) == sorted([healed, failed])
    assert {f["reason"] for f in wait["failed"]} == {"unauthorized"}
    assert healing.exit_code == 0, healing.output
    assert "1 sent" in healing.stdout
    assert "1 ready" in healing.stdout

    assert dry.exit_code == 0, dry.output
    listed = report(dry)
    assert listed["dry_run"] is True
    assert listed["published"] is False
    assert [(r["brand_id"], r["title"], r["parent"]) for r in listed["re_requested"]] == [
        (failed, title_of(failed), PARENT)
    ]
    assert listed["re_requested"][0]["failed_attempt_id"] == first_attempt
    assert [(s["brand_id"], s["status"]) for s in listed["skipped"]] == [(healed, "ready")]
    assert dry_depth == 0

    assert done.exit_code == 0, done.output
    line, count = done.stdout.splitlines()
    assert line.startswith(
        f"re-requested {failed}: {title_of(failed)!r} under {PARENT} (attempt "
        f"{first_attempt} failed unauthorized at "
    ), line
    assert count == "1 brand re-requested; 1 skipped, failed before but not now (1 ready)"
    assert depth == 1
    assert other_reason.exit_code == 0
    assert other_reason.stdout.strip() == "0 brands re-requested"

    latest = attempts_of(pg_database, failed)
    assert [a["state"] for a in latest] == ["promoted", "failed"]  # newest first
    assert again.exit_code == 0, again.output
    assert report(again)["counts"] == {"re_requested": 0, "refused": 0, "skipped": 2}


def test_a_file_past_its_bound_sends_the_lines_before_and_reports_the_rest(
    env: dict[str, str], rabbit_url: str
) -> None:
    first, second = brands(2)
    lines = [
        json.dumps({"brand_id": b, "title": title_of(b), "parent": PARENT}) for b in (first, second)
    ]
    endless = '{"brand_id": "' + "x" * ROLLOUT_MAX_BYTES  # one line that never ends
    result = invoke(env, "rollout", "-", stdin="\n".join([*lines, endless]))
    published = take(rabbit_url, COMMANDS_QUEUE, 2, timeout=2.0)

    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == (
        f"line 3: the file is larger than {ROLLOUT_MAX_BYTES} bytes (ROLLOUT_MAX_BYTES): "
        "this line and those after it were not read; split the file"
    )
    assert "1 bad line (line 3, not sent)" in result.stdout
    sent = sorted(decode(raw(m.body), content_type=m.content_type).fields["brand_id"]
                  for m in published)  # fmt: skip
    assert sent == sorted([first, second])
