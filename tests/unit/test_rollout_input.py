"""The rollout file (`worker.rollout_input.parse_rollout`): CSV with a header row or
JSON lines, told apart by the first non-blank line; every bad line reported with
its number while the others count; a brand_id on two lines refused on both."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from worker.cli.main import main
from worker.cli.rollout import Watched, read_bounded, wait_state
from worker.redrive import choose
from worker.rollout_input import ROLLOUT_MAX_BYTES, BadLine, Line, parse_rollout

HEADER = "brand_id,title,parent\n"


def bad(text: str | bytes) -> list[tuple[int, str]]:
    return [(b.number, b.error) for b in parse_rollout(text).bad]


def good(text: str | bytes) -> list[tuple[int, str, str, str]]:
    return [(x.number, x.brand_id, x.title, x.parent) for x in parse_rollout(text).lines]


def test_csv_with_a_header_row_in_any_column_order() -> None:
    text = "title,parent,brand_id\nAcme Shoes,org-1,b-1\n\n  Acme Hats , org-1 ,b-2\n"
    parsed = parse_rollout(text)

    assert parsed.format == "csv"
    assert parsed.lines == [
        Line(2, "b-1", "Acme Shoes", "org-1"),
        Line(4, "b-2", "Acme Hats", "org-1"),
    ]
    assert parsed.bad == []


def test_csv_quoting_a_byte_order_mark_and_crlf_line_ends() -> None:
    text = '\ufeffbrand_id,title,parent\r\nb-1,"Acme, Inc.",org-1\r\nb-2,"Say ""hi""",org-1\r\n'

    assert good(text) == [(2, "b-1", "Acme, Inc.", "org-1"), (3, "b-2", 'Say "hi"', "org-1")]
    assert good(text.encode()) == good(text)


def test_json_lines() -> None:
    rows = [{"brand_id": "b-1", "title": "Acme", "parent": "org-1"},
            {"parent": "org-2", "title": "Émile & Co", "brand_id": "b-2"}]  # fmt: skip
    text = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    parsed = parse_rollout(text.encode())

    assert parsed.format == "jsonl"
    assert good(text) == [(1, "b-1", "Acme", "org-1"), (2, "b-2", "Émile & Co", "org-2")]
    assert parsed.bad == []


def test_the_format_is_told_by_the_first_non_blank_line() -> None:
    jsonl = '\n   \n{"brand_id": "b", "title": "T", "parent": "p"}\n'
    assert parse_rollout(jsonl).format == "jsonl"
    assert good(jsonl) == [(3, "b", "T", "p")]
    assert parse_rollout("\n\n" + HEADER + "b,T,p\n").format == "csv"
    assert parse_rollout("").format == "empty"
    assert parse_rollout(" \n\n").lines == []
    assert bad('[{"brand_id": "b"}]') == [(1, "a JSON array: give one JSON object per line")]


def test_bad_csv_lines_are_reported_by_number_and_the_rest_count() -> None:
    text = HEADER + "\n".join([
        "b-1,Acme,org",       # 2 good
        "b-2,,org",           # 3 empty title
        "b-3,Acme",           # 4 a field short
        "b-4,Acme,org,more",  # 5 a field more
        "   ,Acme,org",       # 6 blank brand_id
        "b-5,Acme\tTab,org",  # 7 a control character
        f"b-6,{'x' * 201},org",  # 8 longer than the schema allows
        'b-7,"Acme"x,org',    # 9 broken quoting
        "b-8,Acme,org",       # 10 good
    ]) + "\n"  # fmt: skip

    assert good(text) == [(2, "b-1", "Acme", "org"), (10, "b-8", "Acme", "org")]
    assert bad(text) == [
        (3, "title is empty"),
        (4, "2 fields where the header has 3"),
        (5, "4 fields where the header has 3"),
        (6, "brand_id is empty"),
        (7, "title holds a control character"),
        (8, "refused by the message schema: title: Length must be between 1 and 200."),
        (9, "unreadable CSV: ',' expected after '\"'"),
    ]


def test_a_quoted_field_over_two_lines_is_numbered_where_it_starts() -> None:
    text = HEADER + 'b-1,"two\nlines",org\nb-2,T,org\n"b-3,T,org\n'

    assert good(text) == [(4, "b-2", "T", "org")]
    assert bad(text) == [
        (2, "title holds a control character"),  # the newline in it
        (5, "unreadable CSV: a quote opened on this line is never closed"),
    ]


NAMES = "the columns brand_id, title, parent"


@pytest.mark.parametrize(
    ("header", "said"),
    [
        ("b-1,Acme,org", f"no header row: the first line must name {NAMES}"),
        ("brand_id,title", f"the header must name {NAMES} (missing parent)"),
        ("brand_id,title,parent,notes", f"the header must name {NAMES} (unknown notes)"),
        ("brand_id,title,title,parent", f"the header must name {NAMES} (title twice)"),
    ],
)
def test_a_bad_header_leaves_no_good_line(header: str, said: str) -> None:
    parsed = parse_rollout(f"{header}\nb-1,Acme,org\n")

    assert parsed.lines == []
    assert parsed.bad == [BadLine(1, said)]


def test_a_header_is_read_whatever_its_case_and_spaces() -> None:
    assert good(" Brand_ID , Title ,PARENT\nb,T,p\n") == [(2, "b", "T", "p")]


def test_bad_json_lines_are_reported_by_number_and_the_rest_count() -> None:
    lines = [
        '{"brand_id": "b-1", "title": "Acme", "parent": "org"}',  # 1 good
        '{"brand_id": "b-2", "title": "Acme"',  # 2 not JSON
        '["b-3", "Acme", "org"]',  # 3 not an object
        '{"brand_id": "b-4", "parent": "org"}',  # 4 no title
        '{"brand_id": 5, "title": "Acme", "parent": "org"}',  # 5 not text
        '{"brand_id": "b-6", "title": "Acme", "parent": "org", "x": 1}',  # 6 an unknown key
        '{"brand_id": "b-7", "title": " ", "parent": "org"}',  # 7 empty once trimmed
        '{"brand_id": "b-8", "title": null, "parent": "org"}',  # 8 null
        "",
        '{"brand_id": "b-9", "title": "Acme", "parent": "org"}',  # 10 good
    ]
    text = "\n".join(lines)

    assert good(text) == [(1, "b-1", "Acme", "org"), (10, "b-9", "Acme", "org")]
    found = dict(bad(text))
    assert sorted(found) == [2, 3, 4, 5, 6, 7, 8]
    assert found[2].startswith("invalid JSON (")
    assert found[3] == "not a JSON object but an array"
    assert found[4] == "missing title"
    assert found[5] == "brand_id must be text, not a number"
    assert found[6] == "unknown key(s) x; the keys are brand_id, title, parent"
    assert found[7] == "title is empty"
    assert found[8] == "title must be text, not null"


def test_a_brand_id_on_two_lines_is_refused_on_both() -> None:
    text = HEADER + "b-1,Acme,org\nb-2,Two,org\nb-1,Other,org\nb-3,Three,org\nb-2,Two,org\n"

    assert good(text) == [(5, "b-3", "Three", "org")]
    assert bad(text) == [
        (2, "brand_id 'b-1' is on line(s) 4 too"),
        (3, "brand_id 'b-2' is on line(s) 6 too"),
        (4, "brand_id 'b-1' is on line(s) 2 too"),
        (6, "brand_id 'b-2' is on line(s) 3 too"),
    ]


def test_duplicates_in_json_lines_and_a_bad_line_of_the_same_brand() -> None:
    lines = [
        '{"brand_id": "b-1", "title": "A", "parent": "p"}',
        '{"brand_id": "b-1", "title": "", "parent": "p"}',  # bad anyway: not a duplicate
        '{"brand_id": "b-2", "title": "B", "parent": "p"}',
        '{"brand_id": "b-2", "title": "B", "parent": "p"}',
    ]

    assert good("\n".join(lines)) == [(1, "b-1", "A", "p")]
    assert bad("\n".join(lines)) == [
        (2, "title is empty"),
        (3, "brand_id 'b-2' is on line(s) 4 too"),
        (4, "brand_id 'b-2' is on line(s) 3 too"),
    ]


def test_bytes_that_are_not_utf8_make_their_line_bad() -> None:
    data = HEADER.encode() + b"b-1,Acme,org\nb-2,Caf\xe9,org\nb-3,Acme,org\n"

    assert good(data) == [(2, "b-1", "Acme", "org"), (4, "b-3", "Acme", "org")]
    assert bad(data) == [(3, "title is not valid UTF-8")]


def test_stdin_is_read_and_its_bad_lines_reported_by_number() -> None:
    """`rollout -` reads stdin; with no good line it publishes nothing, so no broker or
    database is needed to see the report."""
    runner = CliRunner()
    env = {"PROVISIONER_BROKER_URL": "amqp://guest:guest@127.0.0.1:1//"}
    text = HEADER + "b-1,,org\n\nb-2,Acme\n"

    result = runner.invoke(main, ["rollout", "-"], input=text, env=env)
    as_json = runner.invoke(main, ["rollout", "-", "--json"], input=text, env=env)

    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "line 2: title is empty",
        "line 4: 2 fields where the header has 3",
    ]
    assert result.stdout.startswith("stdin (csv, 2 lines): 0 sent, none skipped, 2 bad lines")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["counts"] == {"lines": 2, "sent": 0, "skipped": 0, "bad": 2}
    assert report["bad"] == [{"line": 2, "error": "title is empty"},
                             {"line": 4, "error": "2 fields where the header has 3"}]  # fmt: skip


def test_the_embedded_broker_is_refused_before_the_file_is_read() -> None:
    result = CliRunner().invoke(
        main,
        ["rollout", "-"],
        input=HEADER + "b,T,p\n",
        env={"PROVISIONER_BROKER_URL": "memory://"},
    )

    assert result.exit_code == 3
    assert "set PROVISIONER_BROKER_URL=amqp://" in result.stderr
    assert result.stdout == ""


def test_a_watched_brand_is_pending_until_its_command_made_a_new_attempt() -> None:
    before = Watched("b", "attempt-1")
    assert wait_state(before, None) == "pending"
    assert wait_state(before, {"attempt_id": "attempt-1", "status": "failed"}) == "pending"
    assert wait_state(before, {"attempt_id": "attempt-2", "status": "failed"}) == "failed"
    assert wait_state(before, {"attempt_id": "attempt-2", "status": "ready"}) == "ready"
    in_flight = Watched("b", None, any_attempt=True)
    assert wait_state(in_flight, {"attempt_id": "attempt-1", "status": "pending"}) == "pending"
    assert wait_state(in_flight, {"attempt_id": "attempt-1", "status": "ready"}) == "ready"


def test_retry_chooses_brands_whose_current_attempt_is_a_selected_failure() -> None:
    failed = [
        {"brand_id": "again", "attempt_id": "a2", "failure_reason": "deadline", "finished_at": 2},
        {"brand_id": "again", "attempt_id": "a1", "failure_reason": "deadline", "finished_at": 1},
        {"brand_id": "healed", "attempt_id": "h1", "failure_reason": "deadline", "finished_at": 1},
        {"brand_id": "moved", "attempt_id": "m1", "failure_reason": "deadline", "finished_at": 1},
        {"brand_id": "gone", "attempt_id": "g1", "failure_reason": "deadline", "finished_at": 1},
    ]
    brands = {
        "again": {"status": "failed", "attempt_id": "a2"},
        "healed": {"status": "ready", "attempt_id": "h2"},
        "moved": {"status": "failed", "attempt_id": "m2"},  # failed later, for another reason
        "gone": {"status": "deactivated", "attempt_id": "g1"},
    }

    chosen, skipped = choose(failed, brands)

    assert [(c.brand_id, c.attempt_id, c.failure_reason) for c in chosen] == [
        ("again", "a2", "deadline")
    ]
    assert [(s["brand_id"], s["why"]) for s in skipped] == [
        ("healed", "ready"), ("moved", "its latest failure not selected"), ("gone", "deactivated")
    ]  # fmt: skip


def test_lines_under_a_parent_not_configured_are_bad_and_the_rest_count() -> None:
    text = "brand_id,title,parent\nb1,Acme,org-a\nb2,Bolt,elsewhere\nb3,Cord,org-b\n"
    found = parse_rollout(text, parents=("org-a", "org-b"))
    assert [line.brand_id for line in found.lines] == ["b1", "b3"]
    assert found.bad == [BadLine(3, "parent 'elsewhere' is not one of PROVISIONER_PARENT_IDS")]
    assert [line.brand_id for line in parse_rollout(text).lines] == ["b1", "b2", "b3"]


# -- the file's bound: read a line at a time, the lines before it count ---------------


def test_a_file_within_its_bound_is_read_whole() -> None:
    data = b"brand_id,title,parent\nb1,T1,p\nb2,T2,p"  # no newline at the end
    assert read_bounded(io.BytesIO(data), limit=len(data)) == (data, None)


def test_past_the_bound_the_rest_is_one_bad_line_and_the_lines_before_count() -> None:
    head = b"brand_id,title,parent\nb1,T1,p\nb2,T2,p\n"
    data = head + b"b3,T3,p\n" + b"b4,T4,p\n"
    read, unread_from = read_bounded(io.BytesIO(data), limit=len(head) + 5)
    assert (read, unread_from) == (head, 4)
    parsed = parse_rollout(read, unread_from=unread_from, limit=len(head) + 5)
    assert [line.brand_id for line in parsed.lines] == ["b1", "b2"]
    assert parsed.bad == [
        BadLine(
            4,
            f"the file is larger than {len(head) + 5} bytes (ROLLOUT_MAX_BYTES): this line "
            "and those after it were not read; split the file",
        )
    ]


class Counting(io.BytesIO):
    """A stream that remembers the most it was asked for at once."""

    most = 0

    def readline(self, size: int | None = -1) -> bytes:
        self.most = max(self.most, size if size is not None else -1)
        return super().readline(size)


def test_one_endless_line_is_never_read_past_the_bound() -> None:
    stream = Counting(b'{"brand_id": "' + b"x" * 10_000_000)
    assert read_bounded(stream, limit=1000) == (b"", 1)
    assert 0 < stream.most <= 1001


def test_the_default_bound_holds_a_large_rollout() -> None:
    line = b"brand-0123456789abcdef,Brand 0123456789 with a longish name,org-parent-0001\n"
    assert ROLLOUT_MAX_BYTES // len(line) > 150_000
