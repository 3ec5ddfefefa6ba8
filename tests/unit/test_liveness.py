"""Heartbeats: the decision, the writer's pace, the checks and the gauge."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from domain.liveness import Beat, Liveness, beat_interval_s, liveness
from infrastructure.settings.model import Settings
from infrastructure.views.connection import ViewConnection
from infrastructure.views.heartbeats import Heartbeat, read_beats
from worker.health.liveness import heartbeat_check
from worker.health.metrics import StateCollector
from worker.health.report import checks_for
from worker.health.results import Degraded, Health, Unhealthy

NOW = 1_900_000_000.0


def beat(at: float, component: str = "relay") -> Beat:
    return Beat(component, "host:42", at - 100, at)


def test_never_seen_alive_and_silent() -> None:
    assert liveness(None, NOW, 60) is Liveness.NEVER_SEEN
    assert liveness(beat(NOW - 60), NOW, 60) is Liveness.ALIVE
    assert liveness(beat(NOW - 60.5), NOW, 60) is Liveness.SILENT
    assert liveness(beat(NOW + 5), NOW, 60) is Liveness.ALIVE  # the writer's clock ahead


def test_a_component_beats_four_times_per_allowed_age_at_most_every_5_s() -> None:
    assert beat_interval_s(60) == 5.0
    assert beat_interval_s(2) == 0.5


def facts_of(beats: dict[str, Beat] | Exception | None) -> Any:
    return lambda: {"heartbeats": beats}


def test_the_check_fails_a_silent_component_since_its_beat_became_too_old() -> None:
    check = heartbeat_check(facts_of({"relay": beat(NOW - 75)}), "relay", 60, clock=lambda: NOW)
    with pytest.raises(Unhealthy) as failed:
        check()
    assert not isinstance(failed.value, Degraded)
    assert str(failed.value) == (
        "the relay has not beaten for 75 s (threshold 60 s; last seen in host:42): "
        "it stopped or hangs"
    )
    assert failed.value.since == datetime.fromtimestamp(NOW - 15, UTC)
    fresh = heartbeat_check(facts_of({"relay": beat(NOW - 3)}), "relay", 60, clock=lambda: NOW)
    assert fresh() == "beat 3 s ago in host:42"


def test_a_component_never_seen_is_a_warning_naming_what_starts_it() -> None:
    check = heartbeat_check(facts_of({"relay": beat(NOW)}), "reconciler", 60, clock=lambda: NOW)
    with pytest.raises(Degraded, match=r"no reconciler has ever run.*`provisioner reconcile`"):
        check()
    [result] = Health([("reconciler_heartbeat", check)]).run()
    assert result.ok
    assert result.degraded
    in_process = heartbeat_check(facts_of(None), "relay", 60)
    assert in_process() == "not tracked in an in-process store"
    unread = heartbeat_check(facts_of(ConnectionRefusedError("down")), "relay", 60)
    with pytest.raises(ConnectionRefusedError):
        unread()


def test_a_process_checks_its_own_parts_and_those_they_wait_on() -> None:
    settings = Settings.from_env({"PROVISIONER_DATABASE_URL": "sqlite:///unused.sqlite"})
    names = [name for name, _ in checks_for(settings, ("relay",), gateway=None)[0]]
    assert "relay_heartbeat" in names
    assert "projections_heartbeat" not in names
    assert [name for name, _ in checks_for(settings, ("worker",), gateway=None)[0]] == [
        "database", "relay_heartbeat", "reconciler_heartbeat", "workers",
    ]  # fmt: skip
    alone = [name for name, _ in checks_for(settings, ("projections",), gateway=None)[0]]
    assert alone == ["database", "projection_lag", "projections_heartbeat"]
    every = [name for name, _ in checks_for(settings, ("worker", "relay", "projections",
                                                       "reconciler"), gateway=None)[0]]  # fmt: skip
    assert {"relay_heartbeat", "projections_heartbeat", "reconciler_heartbeat"} <= set(every)


def test_the_gauge_gives_each_components_age() -> None:
    registry = CollectorRegistry(auto_describe=False)
    seen = {"relay": beat(time.time() - 30), "projections": beat(time.time())}
    registry.register(StateCollector(facts_of(seen)))
    text = generate_latest(registry).decode()
    [relay] = [x for x in text.splitlines() if x.startswith(
        'provisioner_component_heartbeat_age_seconds{component="relay"}')]  # fmt: skip
    assert 29 <= float(relay.split()[-1]) < 40
    assert 'provisioner_component_heartbeat_age_seconds{component="projections"}' in text


def test_the_writer_beats_at_most_every_every_s_and_never_raises(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    clock = iter([10.0, 20.0, 30.0])
    heart = Heartbeat(url, "relay", every_s=3600, clock=lambda: next(clock))
    with ViewConnection(url) as conn:
        assert read_beats(conn) == {}  # no table before the first beat
    assert heart.beat()
    assert not heart.beat()  # too soon: nothing written
    with ViewConnection(url) as conn:
        [(name, found)] = read_beats(conn).items()
    assert (name, found.started_at, found.beat_at) == ("relay", 10.0, 20.0)
    assert found.process == heart.process
    heart.close()

    nowhere = Heartbeat(f"sqlite:///{tmp_path / 'no' / 'dir.sqlite'}", "relay", every_s=0)
    assert not nowhere.beat()  # logged, not raised: the component goes on
    assert not Heartbeat(None, "relay", every_s=0).beat()


def test_waiting_beats_meanwhile_and_ends_at_stop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    heart = Heartbeat(url, "reconciler", every_s=0.05)
    stop = threading.Event()
    began = time.monotonic()
    assert not heart.wait(stop, 0.3)
    assert time.monotonic() - began >= 0.3
    with ViewConnection(url) as conn:
        assert time.time() - read_beats(conn)["reconciler"].beat_at < 0.2
    stop.set()
    assert heart.wait(stop, 30)
    heart.close()


def test_a_beat_through_the_components_own_connection_opens_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    heart = Heartbeat(url, "projections", every_s=0)
    assert heart.beat()  # its own connection, while the component has none open
    assert heart._conn is not None
    with ViewConnection(url) as store:
        assert heart.beat(store)
        assert heart._conn is None  # closed: the component's serves
        assert set(read_beats(store)) == {"projections"}
    heart.close()
