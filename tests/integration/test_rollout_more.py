"""More of `provisioner rollout` and `provisioner retry --failed` against PostgreSQL
and RabbitMQ (set up as in test_rollout_cli.py): a brand with an attempt in flight
is not started again; `--wait` shows the counts as they change and ends with the
same counts; `retry --failed --brand B` re-requests B alone."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infrastructure.broker.messages import decode
from infrastructure.broker.topology import COMMANDS_QUEUE
from infrastructure.fake_gateway.server import FakeGateway
from tests.integration.messaging_support import environment, raw, take, title_of, wait_for
from tests.integration.test_rollout_cli import (
    attempts_of,
    brands,
    csv_file,
    invoke,
    provisioner_run,
    report,
    status_of,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def progress(stderr: str) -> list[str]:
    """The counts `--wait` printed (not a terminal: a line each time they change)."""
    return [line for line in stderr.splitlines() if line.startswith("waiting: ")]


def test_a_pending_brand_is_not_started_again_and_wait_follows_it(
    pg_database: str, rabbit_url: str, fake: FakeGateway, tmp_path: Path
) -> None:
    # A created workspace is first polled 1 s after its create: a fresh brand is ready
    # well within `--wait`'s 8 s. One that never settles keeps its attempt pending: a
    # budget of 10 doubling waits would fail it only after 1 + 1023 s.
    env = environment(pg_database, rabbit_url, fake,
                      PROVISIONER_BACKOFF_BASE_S="1", PROVISIONER_MAX_REQUEUES="10")  # fmt: skip
    stuck, *fresh = brands(3)
    fake.script(title_of(stuck), "zombie")
    with provisioner_run(env) as (_, running):
        assert running.worker is not None
        first = invoke(env, "rollout", str(csv_file(tmp_path / "one.csv", [stuck])))
        wait_for(lambda: status_of(pg_database, stuck) == "pending", f"{stuck} pending", 30)
        worker = running.worker
        # Counted once acknowledged, which may come after the status shows it.
        wait_for(lambda: worker.stats.by_type.get("provision", 0) > 0, "provision counted", 10)
        provisions = worker.stats.by_type.get("provision", 0)
        every = csv_file(tmp_path / "every.csv", [stuck, *fresh])
        again = invoke(env, "rollout", str(every), "--wait", "--timeout", "8")
        after = running.worker.stats.by_type.get("provision", 0)

    assert first.exit_code == 0, first.output
    assert provisions == 1
    sent = ", ".join(fresh)
    assert f"2 sent ({sent}), 1 skipped (1 an attempt in flight: {stuck})" in again.stdout
    assert after == provisions + 2  # the fresh brands only
    assert len(attempts_of(pg_database, stuck)) == 1
    # Followed until the timeout: the fresh brands ready, the stuck one still pending.
    assert again.exit_code == 1, again.output
    shown = progress(again.stderr)
    assert shown[0] == "waiting: 0 ready, 0 failed, 3 pending", again.stderr
    assert shown[-1] == "waiting: 2 ready, 0 failed, 1 pending", again.stderr
    assert re.search(rf"After \d+s: 2 ready, 0 failed, 1 pending \({stuck}\)\. Timed out",
                     again.stdout), again.stdout  # fmt: skip


def test_wait_counts_failures_and_retry_for_one_brand_re_requests_it_alone(
    pg_database: str, rabbit_url: str, fake: FakeGateway, tmp_path: Path
) -> None:
    env = environment(pg_database, rabbit_url, fake)
    kept, retried = brands(2)
    since = datetime.now(UTC).isoformat()
    with provisioner_run(env):
        fake.configure(unauthorized_rate=1.0)  # every call refused: both attempts fail
        refused = invoke(env, "rollout", str(csv_file(tmp_path / "b.csv", [kept, retried])),
                         "--wait", "--timeout", "60")  # fmt: skip
    # Nothing consumes now: what `retry` publishes stays on the queue.
    every = invoke(env, "retry", "--failed", "--since", since, "--dry-run", "--json")
    one = invoke(env, "retry", "--failed", "--since", since, "--brand", retried, "--json")
    published = take(rabbit_url, COMMANDS_QUEUE, 2, timeout=2.0)

    assert refused.exit_code == 1, refused.output
    shown = progress(refused.stderr)
    assert shown[0] == "waiting: 0 ready, 0 failed, 2 pending", refused.stderr
    assert shown[-1] == "waiting: 0 ready, 2 failed, 0 pending", refused.stderr
    assert re.search(r"After \d+s: 0 ready, 2 failed \(.*\), 0 pending\.", refused.stdout)

    assert sorted(r["brand_id"] for r in report(every)["re_requested"]) == sorted([kept, retried])
    assert one.exit_code == 0, one.output
    done = report(one)
    assert [r["brand_id"] for r in done["re_requested"]] == [retried]
    assert done["counts"] == {"re_requested": 1, "refused": 0, "skipped": 0}
    [message] = [decode(raw(m.body), content_type=m.content_type) for m in published]
    assert (message.type, message.fields["brand_id"]) == ("provision", retried)
    assert [a["state"] for a in attempts_of(pg_database, kept)] == ["failed"]
