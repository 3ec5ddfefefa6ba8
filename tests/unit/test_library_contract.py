"""The eventsourcing library's API that our one adapter relies on.

`OneTripPostgresRecorder` (infrastructure/store/pg_recorder.py) renders the
library's insert transaction from its recorder's attributes, which buys about
a fifth of the workers' CPU per provision (docs/benchmarks.md, "Save path");
saves go through the library's own `Application.save`. An upgrade of the
library that renames, removes or re-signs what the recorder reads must fail
here, not in production: on failure, compare the library's new
`PostgresApplicationRecorder` with ours and update it.
"""

from __future__ import annotations

import inspect

from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresFactory,
)

from infrastructure.store.eventstore import persistence_env
from infrastructure.store.pg_recorder import OneTripPostgresRecorder


def params(func: object) -> list[str]:
    return list(inspect.signature(func).parameters)  # type: ignore[arg-type]


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
    assert topic == "infrastructure.store.pg_recorder:OneTripPostgresRecorder"
