"""TLS options, built without a network: what every kombu Connection for amqps:// is
given (and what py-amqp makes of it), the refusal's one line, and the start-up
warning for a PostgreSQL URL that would not check the server's certificate."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from amqp.transport import SSLTransport
from kombu.exceptions import OperationalError

from infrastructure import tls
from infrastructure.broker.connection import connection
from infrastructure.broker.failures import broker_failure
from infrastructure.failures import ConfigurationError, ServiceRefused
from infrastructure.settings.model import BrokerTls, Settings
from worker.console import load_settings

URL = "amqps://guest:s3cret@broker.example:5671/provisioning"


def _wrapped_by_py_amqp(
    monkeypatch: pytest.MonkeyPatch, ssl_option: Any
) -> tuple[ssl.SSLContext, dict[str, Any]]:
    """The context and arguments py-amqp's SSLTransport wraps its socket with, for the
    `ssl` argument kombu hands it (nothing is connected)."""
    seen: dict[str, Any] = {}

    def wrap_socket(context: ssl.SSLContext, **kwargs: Any) -> str:
        seen.update(context=context, kwargs=kwargs)
        return "wrapped"

    monkeypatch.setattr(ssl.SSLContext, "wrap_socket", wrap_socket)
    transport = SSLTransport("broker.example:5671", ssl=ssl_option)
    assert transport._wrap_socket(object(), **transport.sslopts) == "wrapped"
    return seen["context"], seen["kwargs"]


def test_an_amqps_connection_checks_the_chain_and_the_urls_host() -> None:
    options = connection(URL).ssl
    assert options == {
        "server_hostname": "broker.example",
        "cert_reqs": ssl.CERT_REQUIRED,
        "tls_minimum_version": ssl.TLSVersion.TLSv1_2,
    }


def test_the_settings_ca_and_client_certificate_reach_the_options() -> None:
    given = BrokerTls(ca_file="/ca.pem", cert_file="/me.pem", key_file="/me.key")
    options = connection(URL, given).ssl
    assert options["ca_certs"] == "/ca.pem"
    assert (options["certfile"], options["keyfile"]) == ("/me.pem", "/me.key")


def test_py_amqp_turns_the_hostname_check_on_with_these_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    context, kwargs = _wrapped_by_py_amqp(monkeypatch, connection(URL).ssl)
    assert context.check_hostname is True
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert kwargs["server_hostname"] == "broker.example"


def test_what_kombu_passes_alone_checks_no_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding: `ssl=True` (kombu's own for amqps://) leaves the name unchecked."""
    context, kwargs = _wrapped_by_py_amqp(monkeypatch, True)
    assert context.check_hostname is False
    assert kwargs["server_hostname"] is None


@pytest.mark.parametrize("url", ["amqp://guest:guest@127.0.0.1:5672//", "memory://"])
def test_plain_and_in_process_brokers_get_no_tls(url: str) -> None:
    assert not connection(url).ssl


def test_tls_options_in_the_broker_url_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="PROVISIONER_BROKER_CA_FILE"):
        connection(f"{URL}?ssl_cert_reqs=CERT_NONE")


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ValueError, match="key"):
        BrokerTls(cert_file="/me.pem")


def test_settings_carry_the_broker_tls_files(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for path in files.values():
        path.write_text("-")
    settings = Settings.from_env(
        {
            "PROVISIONER_BROKER_CA_FILE": str(files["ca"]),
            "PROVISIONER_BROKER_CERT_FILE": str(files["cert"]),
            "PROVISIONER_BROKER_KEY_FILE": str(files["key"]),
        }
    )
    assert settings.broker_tls() == BrokerTls(
        str(files["ca"]), str(files["cert"]), str(files["key"])
    )
    assert Settings().broker_tls() == BrokerTls()


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    error.verify_code, error.verify_message = code, message
    return error


def test_a_name_mismatch_is_a_refusal_in_one_line() -> None:
    error = _verify_error(64, "IP address mismatch, certificate is not valid for '127.0.0.1'.")
    wrapped = OperationalError("failed")
    wrapped.__cause__ = error
    failure = broker_failure(wrapped, "amqps://guest:guest@127.0.0.1:5671//")
    assert isinstance(failure, ServiceRefused)
    assert str(failure) == (
        "TLS: RabbitMQ at amqps://guest:***@127.0.0.1:5671// presented a certificate that is "
        "not valid for 127.0.0.1 (hostname mismatch): check PROVISIONER_BROKER_URL's host, "
        "or PROVISIONER_BROKER_CA_FILE"
    )


def test_an_untrusted_chain_says_which_ca_to_set() -> None:
    error = _verify_error(20, "unable to get local issuer certificate")
    failure = broker_failure(error, URL)
    assert isinstance(failure, ServiceRefused)
    assert "(unable to get local issuer certificate)" in str(failure)
    assert "set PROVISIONER_BROKER_CA_FILE to the CA that signed it" in str(failure)
    assert "\n" not in str(failure)


def test_a_gateway_certificate_is_not_taken_for_the_brokers() -> None:
    error = httpx.ConnectError("certificate verify failed")
    error.__cause__ = _verify_error(62, "Hostname mismatch")
    assert broker_failure(error, URL) is None


@pytest.mark.parametrize(
    ("url", "env", "warned"),
    [
        ("postgresql://provisioner@db.example/events", {}, "sslmode=prefer"),
        ("postgresql://db.example/events?sslmode=require", {}, "sslmode=require"),
        ("postgresql://db.example/events?sslmode=verify-ca", {}, "sslmode=verify-ca"),
        ("postgresql://db.example/events", {"PGSSLMODE": "disable"}, "sslmode=disable"),
        ("postgresql://127.0.0.1,db.example/events", {}, "reaches db.example with"),
        ("postgresql://127.0.0.1/events?hostaddr=10.0.0.5", {}, "reaches 10.0.0.5 (hostaddr)"),
        ("postgresql:///events", {"PGHOST": "db.example"}, "reaches db.example (PGHOST)"),
        ("postgresql:///events", {"PGHOSTADDR": "10.0.0.5"}, "10.0.0.5 (PGHOSTADDR) with"),
        ("postgresql://localhost/events", {"PGHOSTADDR": "10.0.0.5"}, "(PGHOSTADDR)"),
        ("postgresql://a,b/events?hostaddr=127.0.0.1,", {}, "reaches b with"),
        ("postgresql://db.example/events?hostaddr=127.0.0.1", {}, None),  # a tunnel
        ("postgresql:///events", {"PGHOST": "/var/run/postgresql"}, None),
        ("postgresql:///events", {"PGHOST": "localhost", "PGHOSTADDR": "::1"}, None),
        ("postgresql://127.0.0.1/events", {"PGHOST": "db.example"}, None),  # the URL's wins
        ("postgresql://db.example/events?sslmode=verify-full", {}, None),
        ("postgresql://db.example/events", {"PGSSLMODE": "verify-full"}, None),
        ("postgresql://root@127.0.0.1:5432/events", {}, None),
        ("postgresql://localhost/events", {}, None),
        ("postgresql://[::1]/events", {}, None),
        ("postgresql:///events?host=/var/run/postgresql", {}, None),
        ("sqlite:///var/provisioner.sqlite", {}, None),
        ("memory://", {}, None),
    ],
)
def test_which_database_urls_are_warned_about(
    url: str, env: dict[str, str], warned: str | None
) -> None:
    why = tls.unverified_database(url, env)
    if warned is None:
        assert why is None
    else:
        assert why is not None
        assert warned in why
        assert "sslmode=verify-full" in why


def test_load_settings_warns_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tls, "_warned", set())
    monkeypatch.setenv("PROVISIONER_DATABASE_URL", "postgresql://app:pw@db.example:5432/events")
    monkeypatch.delenv("PGSSLMODE", raising=False)
    caplog.set_level(logging.WARNING, "provisioner")
    load_settings()
    load_settings()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "PROVISIONER_DATABASE_URL reaches db.example with sslmode=prefer: the server's "
        "certificate and name are not checked; add ?sslmode=verify-full&sslrootcert=<CA file> "
        "to the URL"
    ]
