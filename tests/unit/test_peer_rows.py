"""The conventional peer's row per brand (bench/peer_rows.py), on SQLite: a
provision binds only while its attempt id is still the brand's."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from bench import peer_rows

P = "?"  # sqlite3's placeholder


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    peer_rows.create_table(db)
    yield db
    db.close()


def row(db: sqlite3.Connection, brand: str) -> tuple[str, str, str | None, float | None]:
    return db.execute(
        "SELECT attempt_id, state, workspace_id, ready_at FROM brands WHERE brand_id = ?", (brand,)
    ).fetchone()


def test_the_requested_attempt_binds_its_workspace(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "a1", 1.0, P)

    assert peer_rows.bind(conn, "b1", "a1", "ws-1", 2.0, P) is True
    assert row(conn, "b1") == ("a1", "ready", "ws-1", 2.0)


def test_a_superseded_attempt_cannot_bind(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "a1", 1.0, P)
    peer_rows.request(conn, "b1", "a2", 1.5, P)  # requested again: a new attempt id

    assert peer_rows.bind(conn, "b1", "a1", "ws-old", 2.0, P) is False
    assert row(conn, "b1") == ("a2", "requested", None, None)
    assert peer_rows.bind(conn, "b1", "a2", "ws-new", 3.0, P) is True
    assert row(conn, "b1") == ("a2", "ready", "ws-new", 3.0)


def test_a_new_request_clears_a_binding(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "a1", 1.0, P)
    peer_rows.bind(conn, "b1", "a1", "ws-1", 2.0, P)
    peer_rows.request(conn, "b1", "a2", 4.0, P)

    assert row(conn, "b1") == ("a2", "requested", None, None)
    assert peer_rows.bind(conn, "b1", "a1", "ws-1", 5.0, P) is False


def test_other_brands_are_untouched(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "same", 1.0, P)
    peer_rows.request(conn, "b2", "same", 1.0, P)

    assert peer_rows.bind(conn, "b1", "same", "ws-1", 2.0, P) is True
    assert row(conn, "b2") == ("same", "requested", None, None)
    assert peer_rows.bind(conn, "b3", "same", "ws-3", 2.0, P) is False  # no such row


def test_a_failure_never_overwrites_a_binding(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "a1", 1.0, P)
    peer_rows.bind(conn, "b1", "a1", "ws-1", 2.0, P)

    assert peer_rows.fail(conn, "b1", "a1", "terminal: failed", P) is False
    assert row(conn, "b1")[1] == "ready"


def test_a_failure_of_the_current_attempt_is_recorded(conn: sqlite3.Connection) -> None:
    peer_rows.request(conn, "b1", "a1", 1.0, P)
    peer_rows.request(conn, "b1", "a2", 1.0, P)

    assert peer_rows.fail(conn, "b1", "a1", "stale", P) is False
    assert peer_rows.fail(conn, "b1", "a2", "terminal: failed", P) is True
    assert row(conn, "b1")[1] == "failed"


def test_tally_counts_ready_and_failed(conn: sqlite3.Connection) -> None:
    for n in range(4):
        peer_rows.request(conn, f"b{n}", f"a{n}", 1.0, P)
    peer_rows.bind(conn, "b0", "a0", "ws-0", 2.0, P)
    peer_rows.bind(conn, "b1", "a1", "ws-1", 3.5, P)
    peer_rows.fail(conn, "b2", "a2", "x", P)

    assert peer_rows.tally(conn) == (2, 1, 4, 3.5)


def test_poll_delay_doubles_up_to_its_cap() -> None:
    assert [peer_rows.poll_delay(n, 1.0, 5.0) for n in range(1, 6)] == [1, 2, 4, 5, 5]
