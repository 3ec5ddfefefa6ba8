"""The settings, declared once: one `Setting` a variable, with its parser (its
type and bounds), its default, what it means and the section of
docs/configuration.md it belongs in.

From this table come `Settings`' defaults and its parsing
(infrastructure/settings/model.py), the list of known names that an unknown
PROVISIONER_* name is checked against (infrastructure/settings/checks.py), the
engine's defaults (`EngineSettings`), and the tables of docs/configuration.md
(`.venv/bin/python -m infrastructure.settings.docs` writes them). A setting's
attribute is its name without the prefix, in lower case. To add one: a row here,
its field in `Settings`, and the docs written again; the unit tests name what
is missing. Checks across settings stay in `Settings.from_env`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from domain.pacing import MIN_RATE
from infrastructure.settings.parsing import (
    LOG_FORMATS,
    AllowedHosts,
    Choice,
    DatabaseUrl,
    File,
    Flag,
    Host,
    Number,
    ParentIds,
    Parser,
    Scopes,
    Token,
    Url,
    env_value,
)
from infrastructure.store.eventstore import CONNECT_WAIT_DEFAULT_S

DEFAULT_DATABASE_URL = "sqlite:///var/provisioner.sqlite"
BROKER_SCHEMES = ("amqp", "amqps", "pyamqp", "memory")
GATEWAY_SCHEMES = ("http", "https")


class Section(Enum):
    """Where a setting is documented: docs/configuration.md's headings, in this order."""

    STORE = "The event store and the broker"
    GATEWAY = "The gateway"
    COMMANDS = "Parents and producers"
    HOPS = "Hops and attempts"
    HEALTH = "Health, metrics and logs"
    WEB = "The web view"


@dataclass(frozen=True, slots=True)
class Setting:
    """One PROVISIONER_* variable. `note` is said beside the default in the docs;
    `fields` gives the `Settings` fields of a value when they are not the one
    named after the variable."""

    name: str
    parser: Parser
    default: Any
    section: Section
    meaning: str
    note: str = ""
    fields: Callable[[Any], dict[str, Any]] | None = None

    @property
    def attribute(self) -> str:
        """The `Settings` field: the name without its prefix, lower case."""
        return self.name.split("_", 1)[1].lower()

    def parse(self, env: Mapping[str, str]) -> Any:
        """The value in `env`, checked; the default when unset (set but empty: an error)."""
        raw = env_value(env, self.name)
        return self.default if raw is None else self.parser.parse(self.name, raw)

    def values(self, value: Any) -> dict[str, Any]:
        """The `Settings` fields a value of this variable sets."""
        return {self.attribute: value} if self.fields is None else self.fields(value)


def written(value: Any) -> str | None:
    """How a value is written in the environment; None for one that is left unset."""
    if value is None or value == ():
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _fake_switch(mode: str) -> dict[str, Any]:
    """`1`: the in-process fake; `test`: the fake on PostgreSQL or RabbitMQ, on purpose."""
    return {"fake_gateway": mode != "0", "fake_gateway_test": mode == "test"}


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "PROVISIONER_DATABASE_URL",
        DatabaseUrl(),
        DEFAULT_DATABASE_URL,
        Section.STORE,
        "event store: `postgresql://user[:pw]@host[:port]/db`, `sqlite:///relative`, "
        "`sqlite:////absolute`, `memory://`. A SQLite file the service creates is `0600` "
        "and a folder it creates for it (`./var` by default) `0700`: the log holds every "
        "brand and title. A file that exists keeps its mode; one every user may read gets a "
        "warning in the log at start",
    ),
    Setting(
        "PROVISIONER_BROKER_URL",
        Url(BROKER_SCHEMES),
        "memory://",
        Section.STORE,
        "`amqp://user:pw@host:5672/vhost` in production",
    ),
    Setting(
        "PROVISIONER_ALLOW_MIXED_EMBEDDED",
        Flag(),
        False,
        Section.STORE,
        "`1`: the embedded default may be half used, a SQLite (or `memory://`) store with "
        "RabbitMQ or PostgreSQL with the in-process `memory://` broker; otherwise refused, "
        'exit 3 (below, "The embedded default is all or nothing")',
    ),
    Setting(
        "PROVISIONER_BROKER_CA_FILE",
        File(),
        None,
        Section.STORE,
        "for `amqps://`: the CA certificates (PEM) the broker's certificate must chain to. "
        "Every broker connection checks the chain and that the certificate names the URL's "
        "host; one that fails is refused in one line, exit 4, before any AMQP is sent "
        "(`TLS: RabbitMQ at ... presented a certificate that is not valid for <host> "
        "(hostname mismatch): ...`). TLS options in the URL (`?ssl_...`) are refused, exit "
        "3",
        note="the system's CAs",
    ),
    Setting(
        "PROVISIONER_BROKER_CERT_FILE",
        File(),
        None,
        Section.STORE,
        "for `amqps://`: a client certificate (PEM) shown to the broker; with "
        "`PROVISIONER_BROKER_KEY_FILE`, both or neither (exit 3)",
    ),
    Setting(
        "PROVISIONER_BROKER_KEY_FILE",
        File(),
        None,
        Section.STORE,
        "the client certificate's private key (PEM, not encrypted)",
    ),
    Setting(
        "PROVISIONER_QUEUE_TYPE",
        Choice(("classic", "quorum")),
        "classic",
        Section.STORE,
        "`quorum` on a clustered RabbitMQ (adds a delivery limit); must match the queues "
        'that exist (else exit 4, "inequivalent arg")',
    ),
    Setting(
        "PROVISIONER_CONNECT_WAIT_S",
        Number(0, 86400),
        CONNECT_WAIT_DEFAULT_S,
        Section.STORE,
        'how long a one-shot command retries a database that is down or full ("too many '
        'clients") before it exits 5 (`0`: one try, no wait); long-running processes wait '
        "until it is back",
    ),
    Setting(
        "PROVISIONER_GATEWAY_URL",
        Url(GATEWAY_SCHEMES),
        None,
        Section.GATEWAY,
        "base URL of the workspace gateway (`http://` or `https://`); required by `worker` "
        "and `run` unless the fake is asked for",
    ),
    Setting(
        "PROVISIONER_GATEWAY_TOKEN",
        Token(),
        None,
        Section.GATEWAY,
        "bearer token; required with a gateway URL; never logged or stored: a command "
        "whose brand id, title or parent holds it (a token of 8 characters or more) is "
        "refused and dead-lettered without echoing it",
    ),
    Setting(
        "PROVISIONER_GATEWAY_CA_FILE",
        File(),
        None,
        Section.GATEWAY,
        "the CA certificates (PEM) an `https://` gateway's certificate must chain to, and "
        "then only these. Either way the certificate must name the URL's host: a call to "
        "one that does not is never sent (the token stays here) and fails `certificate "
        "verify failed: ... mismatch`",
        note="httpx's: `SSL_CERT_FILE`, else the certifi bundle",
    ),
    Setting(
        "PROVISIONER_GATEWAY_ALLOW_HTTP",
        Flag(),
        False,
        Section.GATEWAY,
        "`1`: a plain `http://` gateway URL to a host other than loopback is accepted (a "
        "trusted network); otherwise it is refused, exit 3, as the token would cross the "
        "network in clear",
    ),
    Setting(
        "PROVISIONER_FAKE_GATEWAY",
        Choice(("0", "1", "test")),
        "0",
        Section.GATEWAY,
        "`1`: `worker` and `run` use the fake gateway in-process instead of a real one "
        "(never together with a gateway URL); refused with PostgreSQL or a real broker "
        'unless `test` (below, "The fake gateway is never used silently")',
        fields=_fake_switch,
    ),
    Setting(
        "PROVISIONER_GATEWAY_TIMEOUT_S",
        Number(0, 600, above=True),
        10.0,
        Section.GATEWAY,
        "read timeout of gateway calls (connect: 3 s)",
    ),
    Setting(
        "PROVISIONER_GATEWAY_RATE",
        Number(MIN_RATE, 10**6),
        None,
        Section.GATEWAY,
        "calls/s for the **whole fleet** (every worker process on this database), a GCRA in "
        "one PostgreSQL row. Set it a little under the gateway's documented limit; it is a "
        "ceiling: 429s dense enough to be a rate limit at it cut the rate under it, and it "
        "grows back (a limiter with no burst, or a quota other clients share). Unset: "
        "no limit until 429s dense enough to be a rate limit; then 70 % of what the fleet "
        "was sending, growing 10 % a second (compounded); each later cut estimates the "
        "limit and goes under it, growing slowly near it "
        '(docs/operations.md, "Pacing the gateway")',
        note="learned",
    ),
    Setting(
        "PROVISIONER_GATEWAY_BURST",
        Number(1, 10**6, integer=True),
        1,
        Section.GATEWAY,
        "calls that may go at once above the rate (1: evenly spaced)",
    ),
    Setting(
        "PROVISIONER_GATEWAY_PROBE_S",
        Number(0, 3600, above=True),
        10.0,
        Section.GATEWAY,
        "after 5 calls in a row got no answer (refused, timeout, dropped, 502, 503, 504; a "
        "500 is one request broken, not an outage) the fleet's circuit opens: calls are "
        "held without being sent and hops deferred; one probe call goes out per this many "
        "seconds (one at a time: no other goes while one may be in flight, up to "
        "`PROVISIONER_GATEWAY_TIMEOUT_S` + 4 s, and a probe that got no answer starts the "
        "interval again); any answer closes it. A 503's Retry-After is not waited for: the "
        "probes find the gateway back",
    ),
    Setting(
        "PROVISIONER_RETRY_AFTER_MAX_S",
        Number(1, 3600),
        300.0,
        Section.GATEWAY,
        "the longest a 429's `Retry-After` (seconds, or an HTTP date) holds every gateway "
        "call of the deployment, and a hop deferred by it waits: a longer one is cut to "
        "this, so one answer cannot hold the fleet for an hour. `provisioner health` says "
        "when the gateway asked for longer, and when a hold in force is longer than this "
        "(stored by a process with a longer cap; the next call cuts it) "
        "(docs/decisions/031-nothing-exposed-spends-the-gateway.md)",
    ),
    Setting(
        "PROVISIONER_PARENT_IDS",
        ParentIds(),
        None,
        Section.COMMANDS,
        "comma-separated ids of the organisation's parent workspaces the service may act "
        "under. Required by every "
        "process that acts on commands or hops (`worker`, `run`, `reconcile`, `provision`, "
        "`deactivate`) unless the fake is in use or the embedded default runs (in-process "
        "broker, no gateway URL), where it is the fake's `org-parent`. A `provision` under "
        "any other parent is refused (`ForeignParent`, dead-lettered); a configured parent "
        "is never a candidate, adopted, bound, claimed or emptied, whichever family lists "
        'it (docs/operations.md, "Parents")',
    ),
    Setting(
        "PROVISIONER_PRODUCER_SCOPES",
        Scopes(),
        None,
        Section.COMMANDS,
        "the brands each producer may command, by its RabbitMQ user: "
        "`USER=BRAND_PATTERN[,...][@PARENT[,...]]`, entries separated by `;`, e.g. "
        "`orders=ord-*,shop-1@org-parent;billing=bill-*`. Patterns are shell-style (`*`, "
        "`?`); parents, when given, narrow the `provision`s of that producer and must be in "
        "`PROVISIONER_PARENT_IDS`. Once set, a command on `provisioning.commands` is "
        "dead-lettered `foreign_producer` (nothing recorded) unless its producer's scope "
        "covers its brand (and parent): a producer not listed, or a command without "
        "`user_id`, is refused too; the service's own user is never scoped. Producers must "
        "publish with `user_id` set to their user, which RabbitMQ checks "
        '(docs/operations.md, "Scoping producers to their brands")',
        note="every producer may command every brand",
    ),
    Setting(
        "PROVISIONER_COMMAND_SKEW_S",
        Number(0, 86400 * 7),
        300.0,
        Section.COMMANDS,
        "how far in the future a command's `requested_at` may be (the producers' clock "
        "skew); a command further ahead is refused (`FutureCommand`, dead-lettered), never "
        "stored: stored, it would make every later command for the brand stale",
    ),
    Setting(
        "PROVISIONER_CONCURRENCY",
        Number(1, 512, integer=True),
        8,
        Section.HOPS,
        "hops in flight per worker process (prefetch: concurrency + 25 %, at least + 2)",
    ),
    Setting(
        "PROVISIONER_BACKOFF_BASE_S",
        Number(0, 86400, above=True),
        5.0,
        Section.HOPS,
        'the wait after the n-th "not yet" (n from 0) is base × 2^n; the wait between a '
        "create and its first poll is base",
    ),
    Setting(
        "PROVISIONER_MAX_REQUEUES",
        Number(0, 30, integer=True),
        5,
        Section.HOPS,
        'how many "not yet" answers an attempt waits out before it fails `exhausted` at '
        'the next: the **settle budget**, spent only by hops where the gateway answered "not '
        'yet" (not by the wait between a create and its first poll)',
    ),
    Setting(
        "PROVISIONER_ATTEMPT_DEADLINE_S",
        Number(0, 10**8, above=True),
        86_400.0,
        Section.HOPS,
        "a hop the gateway did not answer (429, 5xx, timeout, refused, the circuit open) is "
        "**deferred** and does not spend the settle budget; deferral goes on until this "
        "long after the attempt started, then it fails `deadline`. The reconciler fails any "
        "attempt still pending this long after it started. Must be longer than the settle "
        "budget. A day outlasts the outages a SaaS gateway has (minutes to hours) and still "
        "fails a brand the same day it could not be served",
        note="a day",
    ),
    Setting(
        "PROVISIONER_DEFER_MAX_S",
        Number(2, 86400),
        30.0,
        Section.HOPS,
        "the longest wait between two deferred hops in the first hour the gateway is silent "
        "(the n-th deferral in a row waits 2 × 2^n s, up to this, jittered down to half, or "
        "until a 429's Retry-After if later; a call the gateway told when to come back waits "
        "that Retry-After (1 s at least; spread by up to a quarter more, a second at most "
        "and no more than it exceeds 1 s) the first two times in a row, "
        "and a call the fleet's own pace held waits for its turn, up to a quarter more); the "
        "cap doubles with each further hour, up to "
        "600 s. Longer: fewer events per attempt in an outage (one per wait: about 160 in "
        "the first hour at 30 s, some 460 in a day); shorter: brands resume sooner after "
        "it. The deadline over half of it must stay under 1,000,000 hops",
    ),
    Setting(
        "PROVISIONER_STALE_AFTER_S",
        Number(0, 10**7, above=True),
        600.0,
        Section.HOPS,
        "a pending attempt with no event for this long may be superseded",
    ),
    Setting(
        "PROVISIONER_CREATE_GRACE_S",
        Number(0, 86400, above=True),
        60.0,
        Section.HOPS,
        "how long a create that was not confirmed (a timeout, a dropped connection, a 5xx) "
        "may still turn up in the parent's family listing, counted from the create (from "
        "the gateway's return after an outage, for a create it never answered); until then "
        "no second create of that title is made under that parent. Shorter risks a "
        "duplicate upstream when the gateway is slow to list what it made; longer than "
        "`PROVISIONER_GATEWAY_TIMEOUT_S` (refused otherwise: a create still in flight would "
        "be given up)",
    ),
    Setting(
        "PROVISIONER_INFERENCE_WINDOW_S",
        Number(0, 86400, above=True),
        3600.0,
        Section.HOPS,
        "how long after a create's grace began a new same-title child may be credited to "
        'that create when its answer was lost (ours by inference, docs/operations.md "Trust '
        "boundaries\"); after it, such a child is someone else's. Only an empty child is "
        "ever credited, and nothing credited by inference is emptied of projects. At least "
        "`PROVISIONER_CREATE_GRACE_S` (refused otherwise)",
    ),
    Setting(
        "PROVISIONER_DECOMMISSION_DELAY_S",
        Number(0, 86400 * 90),
        259_200.0,
        Section.HOPS,
        "the retention window: how long after a `deactivate` the brand's bound workspace "
        "keeps its projects before a worker empties and unbinds it. The brand reads "
        "`deactivated` at once; a `provision` of the same title and parent before then "
        "re-confirms the same workspace, projects intact. Three days cover a deactivation "
        "made by mistake or a billing lapse of a day or so, noticed and undone after a "
        "weekend; longer keeps data the owner asked to be rid of, and a brand deactivated "
        "and moved to another parent waits as long (or `provisioner deactivate "
        "--purge-now`). `0`: emptied at once, as before",
        note="3 days",
    ),
    Setting(
        "PROVISIONER_METRICS_PORT",
        Number(0, 65535, integer=True),
        0,
        Section.HEALTH,
        "serve `/metrics` (Prometheus), `/healthz` and `/readyz` at this port; every "
        "long-running process (`worker`, `relay`, `projections run`, `reconcile`, `run`); "
        'any other path is 404 (docs/operations.md, "Health and metrics"). A port another '
        "process holds stops the process at start with exit 3, naming the port and this "
        "variable: give each process on a host its own",
        note="off",
    ),
    Setting(
        "PROVISIONER_METRICS_HOST",
        Host(),
        "127.0.0.1",
        Section.HEALTH,
        "the address the metrics port binds: an IPv4 or IPv6 address (`0.0.0.0` or `::` for "
        "every interface, as a Kubernetes probe needs) or a host name; no port or scheme",
    ),
    Setting(
        "PROVISIONER_HEALTH_MAX_LAG",
        Number(0, 10**9, integer=True),
        10_000,
        Section.HEALTH,
        "events the relay or a projection may be behind the log before its readiness check fails",
    ),
    Setting(
        "PROVISIONER_HEALTH_STUCK_AFTER_S",
        Number(0, 10**7, above=True),
        900.0,
        Section.HEALTH,
        "seconds a pending attempt's next hop may be overdue before it counts as stuck (the "
        "`stuck_attempts` check, `provisioner_attempts_stuck`)",
    ),
    Setting(
        "PROVISIONER_HEARTBEAT_MAX_AGE_S",
        Number(0, 10**6, above=True),
        60.0,
        Section.HEALTH,
        "seconds the relay, the projections runner or the reconciler may go without a "
        "heartbeat before its `*_heartbeat` check fails (stopped or hung); each beats every "
        "quarter of it, at most every 5 s, so give every process the same value "
        '(docs/operations.md, "Heartbeats")',
    ),
    Setting(
        "PROVISIONER_AUDIT_EVERY_S",
        Number(0, 86400 * 30),
        86_400.0,
        Section.HEALTH,
        "how often the reconciler runs the upstream audit of each parent on record "
        "(`provisioner audit`, read-only: it fixes nothing), counting its findings in "
        "`provisioner_audit_findings{kind}`; its gateway calls go through the fleet's pace. "
        "`0`: never. It needs the gateway: a `reconcile` process audits only with "
        "`PROVISIONER_GATEWAY_URL` set",
        note="a day",
    ),
    Setting(
        "PROVISIONER_LOG_FORMAT",
        Choice(LOG_FORMATS),
        "auto",
        Section.HEALTH,
        "`json`: one JSON object a line (`time`, `level`, `logger`, `brand`, `attempt`, "
        "`hop`, `outcome`, `reason`, `message`); `text`: plain lines; `auto`: text on a "
        "terminal, JSON otherwise. Read before the other settings (logging starts first); "
        "any other value exits 3. Every line, in either format, goes through a redaction "
        "filter (the token, URL passwords, Authorization values): see docs/operations.md, "
        '"Logs"',
    ),
    Setting(
        "PROVISIONER_WEB_HOST",
        Host(),
        "127.0.0.1",
        Section.WEB,
        "the address `provisioner web` binds (checked like `PROVISIONER_METRICS_HOST`); "
        "`--host` overrides it",
    ),
    Setting(
        "PROVISIONER_WEB_PORT",
        Number(1, 65535, integer=True),
        8080,
        Section.WEB,
        "the port `provisioner web` serves; `--port` overrides it",
    ),
    Setting(
        "PROVISIONER_WEB_TOKEN",
        Token(),
        None,
        Section.WEB,
        "when set, every page of `provisioner web` needs `Authorization: Bearer <token>` "
        "(401 otherwise), and `/readyz` shows its details to it; redacted from logs like "
        "the gateway token. Required when `provisioner web` binds beyond loopback "
        "(`0.0.0.0` and `::` included) unless `PROVISIONER_WEB_ALLOW_OPEN=1`. Without it "
        "no page calls the gateway: the health page's gateway check says "
        '"not checked" and how to allow it, and the view takes no action (its forms appear '
        "only with the token, which also keys their CSRF check: docs/operations.md, "
        '"Web view", "Actions")',
    ),
    Setting(
        "PROVISIONER_WEB_ALLOW_OPEN",
        Flag(),
        False,
        Section.WEB,
        "`1`: `provisioner web` may serve beyond loopback without a token (a trusted "
        "network; a warning is logged at start); otherwise it refuses to start, exit 3",
    ),
    Setting(
        "PROVISIONER_WEB_ALLOWED_HOSTS",
        AllowedHosts(),
        (),
        Section.WEB,
        "the names the web view answers to besides the bound address and `localhost`, "
        "`127.0.0.1`, `[::1]` with the bound port: comma-separated `name` (any port, as "
        "behind a reverse proxy) or `name:port` (IPv6 in brackets). Any other `Host` gets "
        '400 (docs/operations.md, "Web view")',
    ),
)

BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}
VARIABLES: tuple[str, ...] = tuple(BY_NAME)  # the known names, in the table's order
# Each `Settings` field's default, from its setting's.
DEFAULTS: Mapping[str, Any] = {
    field: value for setting in SETTINGS for field, value in setting.values(setting.default).items()
}


def default_of(field: str) -> Any:
    """The default of a `Settings` field (KeyError for a field no setting has)."""
    return DEFAULTS[field]


def whole_range(name: str) -> tuple[int, int]:
    """The bounds of a whole-number setting, for a flag that stands in for it."""
    parser = BY_NAME[name].parser
    if not isinstance(parser, Number) or not parser.integer or parser.above:
        raise TypeError(f"{name} is not a whole number from one bound to another")
    return int(parser.low), int(parser.high)
