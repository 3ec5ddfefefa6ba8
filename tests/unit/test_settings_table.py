"""Settings are declared once, in infrastructure/settings/table.py: `Settings`' fields
and defaults, the engine's defaults and docs/configuration.md's tables all come from
it, and none holds a value of its own."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from infrastructure.settings.docs import COMMAND, PAGE, updated
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.settings.parsing import SettingsError
from infrastructure.settings.table import (
    BY_NAME,
    DEFAULTS,
    SETTINGS,
    Section,
    Setting,
    written,
)


def test_settings_has_a_field_per_setting_with_the_tables_default() -> None:
    fields = {field.name: field.default for field in dataclasses.fields(Settings)}
    assert fields == dict(DEFAULTS)


def test_each_default_has_the_type_its_field_declares() -> None:
    """mypy sees `Settings`' annotations, not the table's values: they must agree."""
    hints = typing.get_type_hints(Settings)
    for name, default in DEFAULTS.items():
        hint = hints[name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = tuple(typing.get_origin(kind) or kind for kind in allowed)
        assert isinstance(default, kinds), (name, default, hints[name])


def test_nothing_set_reads_as_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.name)
def test_each_default_is_a_value_its_own_parser_accepts(setting: Setting) -> None:
    text = written(setting.default)
    if text is not None:
        parsed = setting.parser.parse(setting.name, text)
        assert parsed == setting.default
        assert type(parsed) is type(setting.default)


def test_each_setting_is_read_as_its_parser_says() -> None:
    """The loop of `from_env` gives each variable to its own row's parser: a value
    out of one row's bounds is refused naming that row, in one line."""
    for name in ("PROVISIONER_CONCURRENCY", "PROVISIONER_WEB_PORT", "PROVISIONER_DEFER_MAX_S"):
        with pytest.raises(SettingsError) as raised:
            Settings.from_env({name: "1000000"})
        assert str(raised.value).startswith(f"{name} must be")
        assert "\n" not in str(raised.value)
    assert Settings.from_env({"PROVISIONER_FAKE_GATEWAY": "TEST"}).fake_gateway_test


def test_the_engine_takes_its_defaults_from_the_table() -> None:
    """No second copy of a default: the engine embedded without settings follows the
    same rules as a process started with none set (the retention window among them)."""
    assert EngineSettings() == Settings().engine()
    assert EngineSettings().decommission_delay_s == DEFAULTS["decommission_delay_s"] == 259_200


def test_every_setting_has_a_section_and_a_meaning() -> None:
    assert {setting.section for setting in SETTINGS} == set(Section)
    for setting in SETTINGS:
        assert setting.meaning.strip() == setting.meaning
        assert setting.meaning
        assert "\n" not in setting.meaning
        assert BY_NAME[setting.name] is setting


def test_the_configuration_page_shows_the_table() -> None:
    page = PAGE.read_text()
    assert updated(page) == page, (
        f"docs/configuration.md's settings tables differ from "
        f"infrastructure/settings/table.py: run `{COMMAND}` to write them again"
    )
