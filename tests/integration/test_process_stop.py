"""Every long-running process logs one line when it stops, with the reason."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.cli_support import PROVISIONER, clean_env
from tests.services import free_port


def stop_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "provisioner.process" in line]
    assert len(lines) == 1, stderr
    return lines[0].split("provisioner.process ", 1)[1]


def sqlite_env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = clean_env(
        PROVISIONER_DATABASE_URL=f"sqlite:///{tmp_path / 'events.sqlite'}",
        PROVISIONER_LOG_FORMAT="text", **more,
    )  # fmt: skip
    subprocess.run([PROVISIONER, "db", "init"], env=env, check=True, capture_output=True)
    return env


def test_run_says_it_stopped_on_sigint(tmp_path: Path) -> None:
    env = sqlite_env(tmp_path, PROVISIONER_FAKE_GATEWAY="1")
    with subprocess.Popen(
        [PROVISIONER, "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert "running" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert stop_line(stderr) == "worker + relay + projections + reconciler stopped (SIGINT)"


def test_the_web_view_says_it_stopped_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = sqlite_env(tmp_path)
    with subprocess.Popen(
        [PROVISIONER, "web", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert stop_line(stderr) == "web stopped (SIGTERM)"


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_a_part_that_fails_stops_the_process_and_the_line_says_why(
    pg_database: str, rabbit_session_url: str
) -> None:
    refused = rabbit_session_url.replace("guest:guest@", "guest:wrong-pw@")
    env = clean_env(
        PROVISIONER_DATABASE_URL=pg_database, PROVISIONER_BROKER_URL=refused,
        PROVISIONER_LOG_FORMAT="text",
    )  # fmt: skip
    done = subprocess.run(
        [PROVISIONER, "relay"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 4, done.stderr  # refused for good
    # The one error line is the stop line: it says which part stopped, and why.
    [line] = [x for x in done.stderr.splitlines() if "relay stopped" in x]
    assert line.startswith("Error: relay stopped: RabbitMQ at "), done.stderr
    assert "provisioner.process" not in done.stderr
    assert "wrong-pw" not in done.stderr
