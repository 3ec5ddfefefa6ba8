"""The `provisioner` command line: one composition root per command."""

from __future__ import annotations

import logging
import sys

import click

from infrastructure.eventstore import DatabaseNotInitialised, init_database, redact
from infrastructure.settings import Settings, SettingsError


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log every hop.")
def main(verbose: bool) -> None:
    """Event-sourced provisioning of brand sub-workspaces in the workspace gateway."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


@main.group()
def db() -> None:
    """The event store's schema."""


@db.command("init")
@click.option("--database-url", envvar="PROVISIONER_DATABASE_URL", help="Overrides the setting.")
def db_init(database_url: str | None) -> None:
    """Create the event tables if missing (idempotent, safe to run concurrently)."""
    url = database_url or _settings().database_url
    try:
        init_database(url)
    except (ValueError, DatabaseNotInitialised) as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - one clear line instead of a traceback
        raise click.ClickException(
            f"could not initialise {redact(url)}: {type(exc).__name__}: {exc}"
        ) from None
    click.echo(f"event store ready: {redact(url)}")


@main.command(
    "fake-gateway",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def fake_gateway(args: tuple[str, ...]) -> None:
    """Serve the fake workspace gateway (see `provisioner fake-gateway --help`)."""
    from infrastructure.fake_gateway import main as fake_main

    sys.exit(fake_main(list(args)))


@main.command()
@click.option("--brands", default=20, show_default=True, help="How many brands to provision.")
@click.option("--seed", default=11, show_default=True, help="The fake gateway's seed.")
@click.option(
    "--database-url",
    default="sqlite:///var/demo.sqlite",
    show_default=True,
    help="Where the demo's events go (started afresh).",
)
def demo(brands: int, seed: int, database_url: str) -> None:
    """Provision brands in-process against the fake gateway, with faults, and report."""
    from worker.demo import run_demo

    sys.exit(run_demo(brands=brands, seed=seed, database_url=database_url))


if __name__ == "__main__":
    main()
