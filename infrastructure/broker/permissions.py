"""Who may do what on the broker: the service's user and one user per producer
(docs/operations.md, "Broker permissions").

RabbitMQ grants a user, per virtual host, three regular expressions matched
against the names of exchanges and queues: *configure* (declare, delete),
*write* (publish to an exchange; bind a queue) and *read* (consume, get and
purge a queue; bind from an exchange). The default exchange, to which every
queue is bound by its own name, is `amq.default` to them.

- The service declares, publishes to and consumes its own names (all begin
  `provisioning`), and writes to `amq.default`: a delayed message goes to its
  wait queue by name.
- A producer may publish to the commands exchange and nothing else: it cannot
  declare, read, or reach an internal exchange or, through `amq.default`, a
  queue. What its body says is checked by the worker (`messages.QUEUE_RULES`).

`rabbitmqctl_lines` prints that model as the commands that set it up; it
connects to nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from infrastructure.broker.topology import COMMANDS_EXCHANGE, EXCHANGE

NOTHING = "^$"  # matches no exchange or queue name
DEFAULT_EXCHANGE = "amq.default"


@dataclass(frozen=True, slots=True)
class Grant:
    """One user's permissions on the vhost, and why they are what they are."""

    user: str
    configure: str
    write: str
    read: str
    why: str


def service_grant(user: str) -> Grant:
    own = rf"^{re.escape(EXCHANGE)}(\..+)?$"
    return Grant(
        user,
        configure=own,
        write=rf"^({re.escape(EXCHANGE)}(\..+)?|{re.escape(DEFAULT_EXCHANGE)})$",
        read=own,
        why=f"the service: its own exchanges and queues ({EXCHANGE}*), "
        f"and {DEFAULT_EXCHANGE} for the wait queues",
    )


def producer_grant(user: str) -> Grant:
    return Grant(
        user,
        configure=NOTHING,
        write=f"^{re.escape(COMMANDS_EXCHANGE)}$",
        read=NOTHING,
        why=f"a producer: publishes commands to {COMMANDS_EXCHANGE}, nothing else",
    )


def grants(service_user: str, producers: Sequence[str]) -> list[Grant]:
    """The service's grant, then one per producer (in the order given, once each)."""
    names = [service_user, *dict.fromkeys(producers)]
    if any(not name.strip() for name in names):
        raise ValueError("a user name must not be blank")
    if service_user in producers:
        raise ValueError(f"{service_user!r} is the service's user: a producer needs its own")
    return [service_grant(service_user), *(producer_grant(name) for name in names[1:])]


def rabbitmqctl_lines(vhost: str, service_user: str, producers: Sequence[str]) -> list[str]:
    """The rabbitmqctl commands (and # comments) that set the model up on `vhost`."""
    if not vhost.strip():
        raise ValueError("the vhost must not be blank")
    q = shlex.quote
    lines = [
        '# Broker permissions (docs/operations.md, "Broker permissions").',
        "# Each add_user prompts for the user's password (or reads it from stdin):",
        "# a password on the command line would be kept in the shell's history.",
        "# Skip add_vhost for a vhost that exists already.",
        f"rabbitmqctl add_vhost {q(vhost)}",
    ]
    for grant in grants(service_user, producers):
        lines += [
            f"# {grant.why}",
            f"rabbitmqctl add_user {q(grant.user)}",
            f"rabbitmqctl set_permissions -p {q(vhost)} {q(grant.user)} "
            f"{q(grant.configure)} {q(grant.write)} {q(grant.read)}",
        ]
    return lines
