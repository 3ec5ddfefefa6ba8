"""The eventsourcing library's private API that our save path relies on.

`ProvisionerApplication.save` (infrastructure/eventstore.py) re-implements the
library's `Application.save` through its private `_record`, `_take_snapshots`
and `_notify`, filling a `ProcessingEvent` itself; `OneTripPostgresRecorder`
(infrastructure/pg_recorder.py) renders the library's insert transaction from
its recorder's attributes. An upgrade of the library that renames, removes or
re-signs any of them must fail here, not in production: on failure, compare
the library's new `Application.save` and `PostgresApplicationRecorder` with
ours and update both (docs/benchmarks.md, "Save path", says what they buy).
The recorder buys about a fifth of the workers' CPU; the save nothing
measurable, so when `save` returns to the library's (calling `super().save()`),
the three tests of the save's private steps go with it.
"""

from __future__ import annotations

import inspect

from eventsourcing.application import Application, ProcessingEvent
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)

from infrastructure.eventstore import ProvisionerApplication, persistence_env
from infrastructure.pg_recorder import OneTripPostgresRecorder


def params(func: object) -> list[str]:
    return list(inspect.signature(func).parameters)  # type: ignore[arg-type]


def test_application_save_is_still_record_snapshots_notify() -> None:
    # Our save is the library's with its collection step replaced: if the
    # library's save gains or loses a step, ours must follow it.
    source = inspect.getsource(Application.save)
    steps = ["_record(", "_take_snapshots(", "_notify("]
    assert all(step in source for step in steps), source
    positions = [source.index(step) for step in steps]
    assert positions == sorted(positions)
    assert "collect_events(" in source


def test_the_private_save_steps_take_what_we_pass() -> None:
    assert params(Application._record) == ["self", "processing_event"]
    assert params(Application._take_snapshots) == ["self", "processing_event"]
    assert params(Application._notify) == ["self", "recordings"]
    # Ours overrides none of them.
    for name in ("_record", "_take_snapshots", "_notify"):
        assert getattr(ProvisionerApplication, name) is getattr(Application, name)


def test_processing_event_has_the_fields_we_fill() -> None:
    processing = ProcessingEvent()  # type: ignore[var-annotated]
    assert processing.events == []
    assert processing.aggregates == {}
    assert processing.saved_kwargs == {}
    assert processing.tracking is None
    assert callable(processing.collect_events)
    source = inspect.getsource(Application._record)
    for field in ("processing_event.events", "processing_event.tracking"):
        assert field in source
    assert "processing_event.saved_kwargs" in source
    assert "processing_event.aggregates" in source


def test_postgres_recorder_attributes_the_one_trip_recorder_renders() -> None:
    assert issubclass(OneTripPostgresRecorder, PostgresApplicationRecorder)
    init = inspect.getsource(PostgresApplicationRecorder.__init__)
    for attribute in ("self.channel_name", "self.lock_table_statements"):
        assert attribute in init
    base_init = inspect.getsource(PostgresAggregateRecorder.__init__)
    for attribute in ("self.events_table_name", "self.insert_events_statement"):
        assert attribute in base_init
    assert params(PostgresApplicationRecorder.construct_pg_stored_event)[1:] == [
        "originator_id",
        "originator_version",
        "topic",
        "state",
    ]
    assert params(PostgresApplicationRecorder.insert_events)[:2] == ["self", "stored_events"]
    select = inspect.signature(PostgresApplicationRecorder.select_events).parameters
    assert list(select)[:2] == ["self", "originator_id"]
    for name in ("gt", "lte", "desc", "limit"):
        assert select[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert "self.schema" in inspect.getsource(PostgresDatastore.__init__)
    assert callable(PostgresDatastore.get_connection)


def test_the_factory_still_picks_the_recorder_by_topic() -> None:
    assert PostgresFactory.APPLICATION_RECORDER_TOPIC == "APPLICATION_RECORDER_TOPIC"
    assert "APPLICATION_RECORDER_TOPIC" in inspect.getsource(PostgresFactory.application_recorder)
    env = persistence_env("postgresql://user@localhost:5432/db")
    topic = env[PostgresFactory.APPLICATION_RECORDER_TOPIC]
    assert topic == "infrastructure.pg_recorder:OneTripPostgresRecorder"
