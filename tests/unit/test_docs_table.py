"""The documented hop table is the tested one: docs/hop-table.md lists every row
of tests/unit/test_hop_table.py, in order, and nothing else, each with its step.

After changing a row there, rewrite the table in place and fill in the step of
any new row: `python -m tests.unit.test_docs_table --write`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.unit.test_hop_table import CASES

ROOT = Path(__file__).resolve().parents[2]
TABLE_DOC = ROOT / "docs" / "hop-table.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
START, END = "<!-- hop-table -->", "<!-- /hop-table -->"
# | `decision` (blank: the one above) | situation, as the test names it | step, in words |
ROW = re.compile(r"^\|\s*`?([a-z_]*)`?\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|$")
HEADER = "| decision | situation (first match wins) | step |\n|---|---|---|"


def hop_table_rows() -> list[tuple[str, str]]:
    """Each decision with the names of its rows, in the order the tests hold them."""
    rows: list[tuple[str, str]] = []
    for name, _, _, table in CASES:
        for row in table:
            if (name, row[0]) not in rows:
                rows.append((name, row[0]))
    return rows


def documented_rows(text: str) -> list[tuple[str, str, str]]:
    """The rows between the markers; a blank decision cell repeats the one above."""
    body = text.split(START, 1)[1].split(END, 1)[0]
    rows: list[tuple[str, str, str]] = []
    name = ""
    for line in body.strip().splitlines()[2:]:
        match = ROW.match(line.strip())
        assert match, f"not a table row: {line!r}"
        name = match.group(1) or name
        rows.append((name, match.group(2), match.group(3)))
    return rows


def render(text: str) -> str:
    """The document with its table rewritten from the tests, keeping known steps."""
    steps = {(name, situation): step for name, situation, step in documented_rows(text)}
    lines, previous = [HEADER], ""
    for name, situation in hop_table_rows():
        cell = "" if name == previous else f"`{name}`"
        lines.append(f"| {cell} | {situation} | {steps.get((name, situation), '')} |")
        previous = name
    head, rest = text.split(START, 1)
    return f"{head}{START}\n" + "\n".join(lines) + f"\n{END}{rest.split(END, 1)[1]}"


def test_the_documented_table_is_the_tested_one() -> None:
    documented = documented_rows(TABLE_DOC.read_text())
    rows = [(name, situation) for name, situation, _ in documented]
    assert rows == hop_table_rows(), "rewrite it: python -m tests.unit.test_docs_table --write"
    assert all(step for *_, step in documented), "each row of docs/hop-table.md needs its step"


def test_the_architecture_names_only_tested_decisions() -> None:
    named = {name for name, _, _ in documented_rows(ARCHITECTURE.read_text())}
    assert named, "docs/architecture.md lists the hop's decisions between the markers"
    assert named <= {name for name, _ in hop_table_rows()}


if __name__ == "__main__":
    rendered = render(TABLE_DOC.read_text())
    if "--write" in sys.argv:
        TABLE_DOC.write_text(rendered)
    else:
        print(rendered, end="")
