"""A gateway certificate that does not verify is a refusal, not an outage: the adapter
raises `CertificateRefused` at once (a hop still defers on it), and the gateway check
fails as refused (`health` exits 4), even while the fleet's pace holds every call.
The same against a real TLS server: tests/integration/test_tls.py."""

from __future__ import annotations

import ssl

import httpx
import pytest

from domain.ports import CertificateRefused, FaultKind, TransientGatewayError, fault_of
from infrastructure.failures import ServiceRefused
from infrastructure.gateway.adapter import HttpGateway
from worker.health.checks import GatewayCheck
from worker.health.results import Health, refusal, report

REASON = (
    "TLS: the gateway presented a certificate that is not valid for gw.test (hostname "
    "mismatch): check PROVISIONER_GATEWAY_URL's host, or PROVISIONER_GATEWAY_CA_FILE"
)


def _unverified(request: httpx.Request) -> httpx.Response:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed: Hostname mismatch")
    error.verify_code = 62  # X509_V_ERR_HOSTNAME_MISMATCH
    error.verify_message = "Hostname mismatch"
    raise httpx.ConnectError("certificate verify failed", request=request) from error


def test_the_adapter_raises_a_certificate_refusal_once_and_a_hop_still_defers() -> None:
    sent: list[httpx.Request] = []

    def transport(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return _unverified(request)

    gateway = HttpGateway("https://gw.test", "token-123456", retries=2, retry_backoff_s=0.0,
                          transport=httpx.MockTransport(transport))  # fmt: skip
    with gateway, pytest.raises(CertificateRefused) as raised:
        gateway.status("ws-1")
    assert len(sent) == 1  # retrying cannot change a certificate
    assert raised.value.reason == REASON
    assert isinstance(raised.value, TransientGatewayError)
    assert fault_of(raised.value).kind is FaultKind.TRANSIENT  # the hop defers


class Scripted:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.asked = 0

    def status(self, workspace_id: str) -> str:
        self.asked += 1
        raise self.error


def test_the_gateway_check_fails_as_refused_on_the_adapters_refusal() -> None:
    check = GatewayCheck(Scripted(CertificateRefused("status: not sent", reason=REASON)))
    results = Health([("gateway", check)]).run()
    (result,) = results
    assert (result.ok, result.degraded, result.refused) == (False, False, True)
    assert result.detail == REASON
    assert result.line().startswith(f"FAILING  gateway: {REASON}")
    assert refusal(results) is result
    assert report(results)["status"] == "failing"
    assert report(results)["checks"][0]["refused"] is True


def test_the_handshake_refuses_even_while_the_pace_holds_every_call() -> None:
    """The workers' failed handshakes open the circuit; the check still says why."""
    held = Scripted(TransientGatewayError("status: not sent (circuit open)", paced=True))
    check = GatewayCheck(held, handshake=lambda: ServiceRefused(REASON))
    (result,) = Health([("gateway", check)]).run()
    assert result.refused
    assert result.detail == REASON
    assert held.asked == 0  # no call was needed to know


def test_an_outage_is_still_degraded_and_no_refusal() -> None:
    check = GatewayCheck(Scripted(TransientGatewayError("status: ConnectError")),
                         handshake=lambda: None)  # fmt: skip
    results = Health([("gateway", check)]).run()
    assert results[0].degraded
    assert refusal(results) is None
    assert "refused" not in report(results)["checks"][0]
