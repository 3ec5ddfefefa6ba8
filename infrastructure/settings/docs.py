"""docs/configuration.md's tables of settings, written from the settings' table
(infrastructure/settings/table.py): one table per section, a row per setting.

    .venv/bin/python -m infrastructure.settings.docs           # rewrite the tables
    .venv/bin/python -m infrastructure.settings.docs --check   # exit 1 if they differ

Only the text between the two markers is written; the rest of the page is prose.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from infrastructure.settings.table import SETTINGS, Section, Setting, written

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = ".venv/bin/python -m infrastructure.settings.docs"
BEGIN = (
    "<!-- The settings' tables: written from infrastructure/settings/table.py by "
    f"`{COMMAND}`; edit the table, not these lines. -->"
)
END = "<!-- End of the settings' tables. -->"


def _default(setting: Setting) -> str:
    text = written(setting.default)
    shown = "unset" if text is None else f"`{text}`"
    return f"{shown} ({setting.note})" if setting.note else shown


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The generated part of the page, markers included."""
    lines = [BEGIN]
    for section in Section:
        lines += ["", f"### {section.value}", ""]
        lines += ["| variable | default | accepts | meaning |", "|---|---|---|---|"]
        lines += [
            f"| `{s.name}` | {_cell(_default(s))} | {_cell(s.parser.accepts())} "
            f"| {_cell(s.meaning)} |"
            for s in SETTINGS
            if s.section is section
        ]
    lines += ["", END]
    return "\n".join(lines)


def updated(page: str) -> str:
    """`page` with its generated part written again (ValueError without the markers)."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{PAGE.name} has no settings' tables between the markers {BEGIN!r}")
    return page[:start] + render() + page[end + len(END) :]


def main(argv: Sequence[str] = ()) -> int:
    page = PAGE.read_text()
    fresh = updated(page)
    if "--check" in argv:
        if fresh != page:
            print(f"{PAGE} differs from the settings' table: run `{COMMAND}`")
            return 1
        return 0
    if fresh != page:
        PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
