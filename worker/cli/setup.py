"""`provisioner db init` and `provisioner broker init`: the event store's schema
and the RabbitMQ topology (or the broker permissions, printed)."""

from __future__ import annotations

import click

from infrastructure.store.eventstore import init_database
from worker.console import declared_broker, echo, load_settings


@click.group()
def db() -> None:
    """The event store's schema."""


@db.command("init")
@click.option("--database-url", envvar="PROVISIONER_DATABASE_URL", help="Overrides the setting.")
def db_init(database_url: str | None) -> None:
    """Create the event tables if missing (idempotent, safe to run concurrently)."""
    from infrastructure.redaction import redact_url
    from infrastructure.store.eventstore import check_database_url
    from infrastructure.views.store import SqlViewStore

    settings = load_settings()
    url = database_url or settings.database_url
    check_database_url(url)
    init_database(url, wait_s=settings.connect_wait_s)
    with SqlViewStore(url, wait_s=settings.connect_wait_s) as store:
        store.setup()
    echo(f"event store ready: {redact_url(url)}")


@click.group()
def broker() -> None:
    """The RabbitMQ topology."""


@broker.command("init")
@click.option("--broker-url", envvar="PROVISIONER_BROKER_URL", help="Overrides the setting.")
@click.option("--queue-type", type=click.Choice(["classic", "quorum"]), default=None)
@click.option(
    "--print-permissions",
    is_flag=True,
    help="Print the rabbitmqctl commands that create the users and permissions; connect to "
    "nothing (docs/operations.md, Broker permissions).",
)
@click.option(
    "--producer",
    "producers",
    multiple=True,
    metavar="NAME",
    help="A producer's user, repeatable (default: producer).",
)
@click.option("--service-user", metavar="NAME", help="The service's user (default: provisioner).")
@click.option("--vhost", metavar="V", help="The virtual host (default: provisioning).")
def broker_init(
    *,
    broker_url: str | None,
    queue_type: str | None,
    print_permissions: bool,
    producers: tuple[str, ...],
    service_user: str | None,
    vhost: str | None,
) -> None:
    """Declare exchanges and queues (idempotent), or print the broker permissions."""
    if print_permissions:
        _print_permissions(vhost or "provisioning", service_user or "provisioner", producers)
        return
    if producers or service_user or vhost:
        raise click.UsageError("--producer, --service-user and --vhost go with --print-permissions")
    from infrastructure.broker.topology import Topology
    from infrastructure.settings.parsing import check_url
    from infrastructure.settings.table import BROKER_SCHEMES

    settings = load_settings()
    url = check_url("--broker-url", broker_url or settings.broker_url, BROKER_SCHEMES)
    topology = Topology(queue_type=queue_type or settings.queue_type)
    with declared_broker(url, topology):
        pass
    echo(f"broker topology declared ({topology.queue_type} queues)")


def _print_permissions(vhost: str, service_user: str, producers: tuple[str, ...]) -> None:
    from infrastructure.broker.permissions import rabbitmqctl_lines

    try:
        lines = rabbitmqctl_lines(vhost, service_user, producers or ("producer",))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    echo("\n".join(lines))
