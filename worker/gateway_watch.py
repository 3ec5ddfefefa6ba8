"""A gateway that has never answered is a configuration error until it answers once.

At the start of a process that calls the gateway (`worker`, `run`, a `reconcile`
that audits), `GatewayWatch` reads the status of a workspace that cannot exist
(the health check's cheapest call, through the fleet's pace) until the process
has had any HTTP answer from the gateway, by this call or by any other. Until
then it logs one ERROR line every `every_s` naming PROVISIONER_GATEWAY_URL, the
URL (redacted) and the cause; once an answer came after that, one INFO line, and
it ends.
A gateway that answered once and then stops is an outage: the circuit's lines
say so, not this.
"""

from __future__ import annotations

import logging
import threading

from domain.ports import TransientGatewayError
from infrastructure.gateway.contact import GatewayContact, cause
from infrastructure.redaction import redact
from worker.health.checks import PROBE_WORKSPACE, StatusReader

log = logging.getLogger("provisioner.gateway.lifecycle")
EVERY_S = 30.0


class GatewayWatch:
    def __init__(
        self, gateway: StatusReader, contact: GatewayContact, url: str, *, every_s: float = EVERY_S
    ) -> None:
        self.gateway = gateway
        self.contact = contact
        self.url = redact(url)
        self.every_s = every_s

    def run(self, stop: threading.Event) -> None:
        """Until the first answer (or `stop`): probe, say why not, wait `every_s`."""
        told = False
        while not stop.is_set() and self.contact.answered_at is None:
            why = self._probe()
            if self.contact.answered_at is not None:
                break
            log.error(
                "the gateway at %s has never answered since this process started (%s); "
                "check PROVISIONER_GATEWAY_URL",
                self.url,
                why,
            )
            told = True
            self._pause(stop)
        if self.contact.answered_at is not None:
            # Said at INFO only after an ERROR: a start that is fine stays one line
            # quieter, and a refusal at start-up stays the one line it is.
            level = logging.INFO if told else logging.DEBUG
            again = " now; it is reachable" if told else ""
            log.log(level, "the gateway at %s answered%s", self.url, again)

    def _pause(self, stop: threading.Event) -> None:
        """`every_s`, or less once `stop` is set or another call had an answer."""
        waited = 0.0
        while waited < self.every_s and not stop.is_set():
            if self.contact.wait_answer(min(1.0, self.every_s - waited)):
                return
            waited += 1.0

    def _probe(self) -> str:
        try:
            self.gateway.status(PROBE_WORKSPACE)
        except TransientGatewayError as exc:
            return cause(str(exc))
        except Exception as exc:  # noqa: BLE001 - an answer of any kind was noted already
            return cause(f"{type(exc).__name__}: {exc}")
        return "answered"
