"""The fake gateway's command line: its help lists every admin call."""

from __future__ import annotations

from click.testing import CliRunner

from infrastructure.fake_gateway.cli import serve
from infrastructure.fake_gateway.config import FakeConfig
from infrastructure.fake_gateway.routes import ADMIN_CALLS, _Admin
from infrastructure.fake_gateway.state import FakeState


def test_help_lists_every_admin_route_on_a_line_of_its_own() -> None:
    routes = _Admin(FakeState(FakeConfig(), ("p",))).routes
    served = {(method, pattern.pattern.replace("([^/]+)", "{id}")) for method, pattern, _ in routes}
    assert served == {(method, path) for method, path, _ in ADMIN_CALLS}
    result = CliRunner().invoke(serve, ["--help"])
    assert result.exit_code == 0
    help_lines = [line.strip() for line in result.output.splitlines()]
    for method, path, what in ADMIN_CALLS:
        assert any(
            line.startswith(f"{method} ") and line.split()[1] == path and line.endswith(what)
            for line in help_lines
        ), (method, path)
    assert "/_fake/config" in result.output
    assert "/_fake/scripts" in result.output
    assert "random prefix per start" in " ".join(result.output.split())


def test_each_start_issues_ids_of_its_own_and_a_given_prefix_none() -> None:
    first, second = FakeState(FakeConfig(seed=3), ("p",)), FakeState(FakeConfig(seed=3), ("p",))
    assert first.id_prefix != second.id_prefix
    plain = FakeState(FakeConfig(seed=3), ("p",), id_prefix="")
    assert plain.workspaces["p"].projects[0].count("-") == 1  # prj-<12 hex>
    assert first.workspaces["p"].projects[0].startswith(f"prj-{first.id_prefix}-")
