"""The broker permission model (infrastructure/broker/permissions.py) against the
topology's names, and what `provisioner broker init --print-permissions` prints.
Applied to a real RabbitMQ: tests/integration/test_broker_permissions.py."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from infrastructure.broker.permissions import (
    DEFAULT_EXCHANGE,
    producer_grant,
    rabbitmqctl_lines,
    service_grant,
)
from infrastructure.broker.topology import (
    COMMANDS_EXCHANGE,
    EVENTS_EXCHANGE,
    EXCHANGE,
    Topology,
    wait_rung_ms,
)
from worker.cli.main import main

TOPOLOGY = Topology()
EXCHANGES = [EXCHANGE, EVENTS_EXCHANGE, COMMANDS_EXCHANGE]
QUEUES = [
    str(q.name)
    for q in (TOPOLOGY.hops, TOPOLOGY.commands, TOPOLOGY.dead, TOPOLOGY.wait(wait_rung_ms(5)))
]


def matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None  # as RabbitMQ matches them


def test_the_service_may_configure_write_and_read_every_name_of_its_topology() -> None:
    grant = service_grant("svc")
    for name in EXCHANGES + QUEUES:
        assert matches(grant.configure, name), name
        assert matches(grant.write, name), name
        assert matches(grant.read, name), name
    assert matches(grant.write, DEFAULT_EXCHANGE)  # delayed messages, to their wait queue
    for other in ("amq.topic", "billing.orders", "xprovisioning", "provisioningx"):
        assert not matches(grant.configure, other), other


def test_a_producer_may_write_to_the_commands_exchange_and_nothing_else() -> None:
    grant = producer_grant("orders")
    for name in [*EXCHANGES, DEFAULT_EXCHANGE, "amq.direct"]:
        assert matches(grant.write, name) == (name == COMMANDS_EXCHANGE), name
    for name in [*EXCHANGES, *QUEUES, DEFAULT_EXCHANGE]:
        assert not matches(grant.configure, name), name
        assert not matches(grant.read, name), name


def test_the_printed_lines_parse_back_to_the_grants() -> None:
    lines = rabbitmqctl_lines("v h", "svc", ["orders", "it's billing", "orders"])
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert commands == [
        ["rabbitmqctl", "add_vhost", "v h"],
        ["rabbitmqctl", "add_user", "svc"],
        ["rabbitmqctl", "set_permissions", "-p", "v h", "svc",
         service_grant("svc").configure, service_grant("svc").write, service_grant("svc").read],
        ["rabbitmqctl", "add_user", "orders"],
        ["rabbitmqctl", "set_permissions", "-p", "v h", "orders", "^$",
         r"^provisioning\.commands$", "^$"],
        ["rabbitmqctl", "add_user", "it's billing"],
        ["rabbitmqctl", "set_permissions", "-p", "v h", "it's billing", "^$",
         r"^provisioning\.commands$", "^$"],
    ]  # fmt: skip
    assert all("password" not in line for line in lines if not line.startswith("#"))


@pytest.mark.parametrize(
    ("vhost", "service", "producers"),
    [("v", "svc", ["svc"]), ("v", " ", ["p"]), ("v", "svc", [""]), ("", "svc", ["p"])],
)
def test_a_producer_named_as_the_service_or_a_blank_name_is_refused(
    vhost: str, service: str, producers: list[str]
) -> None:
    with pytest.raises(ValueError, match=r"blank|service's user"):
        rabbitmqctl_lines(vhost, service, producers)


def test_broker_init_prints_the_permissions_without_connecting() -> None:
    env = {"PROVISIONER_BROKER_URL": "amqp://nobody:x@127.0.0.1:1/nowhere"}
    args = ["broker", "init", "--print-permissions", "--producer", "orders", "--vhost", "prov"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == rabbitmqctl_lines("prov", "provisioner", ["orders"])

    plain = CliRunner().invoke(main, ["broker", "init", "--producer", "orders"], env=env)
    assert plain.exit_code == 2
    assert "go with --print-permissions" in plain.output
