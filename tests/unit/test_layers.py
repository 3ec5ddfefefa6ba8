"""The arrows point one way: worker -> infrastructure -> projections -> domain."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["domain", "projections", "infrastructure", "worker"]  # lowest first
ALLOWED_THIRD_PARTY_IN_DOMAIN = {"eventsourcing.domain"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_a_layer_above_it(layer: str) -> None:
    above = LAYERS[LAYERS.index(layer) + 1 :]
    for path in (ROOT / layer).rglob("*.py"):
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top not in above, f"{path.relative_to(ROOT)} imports {name}"


def test_the_domain_imports_only_the_standard_library_and_eventsourcing_domain() -> None:
    import sys

    for path in (ROOT / "domain").rglob("*.py"):
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "domain":
                continue
            assert name in ALLOWED_THIRD_PARTY_IN_DOMAIN, f"{path.name} imports {name}"
