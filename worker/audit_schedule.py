"""The reconciler's upstream audit (`provisioner audit`, read-only) of each parent on
record, one after the other, every `every_s` (PROVISIONER_AUDIT_EVERY_S), on a
thread of its own so that a long audit never holds back a sweep. Its gateway calls
go through the service's gateway port, paced with the fleet. The findings of the
last audit are counted in `provisioner_audit_findings{kind}` and, with `findings`,
recorded per parent for the web view's `/audit` (infrastructure/views/audit_findings.py);
it fixes nothing (`provisioner audit --fix` does, run by an operator)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

from domain.upstream_audit import Audit, Kind
from infrastructure.service import ProvisioningService
from infrastructure.usecases.upstream_audit import audit_parent, parents_on_record
from infrastructure.views.audit_findings import FindingsWriter
from worker.health import metrics

log = logging.getLogger("provisioner.reconciler")
FIRST_AFTER_S = 300.0  # after start: the first audit (not at once: a restart storm)
RETRY_AFTER_S = 300.0  # after an audit that failed (the gateway or the database down)


class AuditSchedule:
    def __init__(
        self,
        service: ProvisioningService,
        every_s: float,
        *,
        first_after_s: float = FIRST_AFTER_S,
        audit: Callable[[ProvisioningService, str], Audit] = audit_parent,
        findings: FindingsWriter | None = None,
    ) -> None:
        self.service = service
        self.every_s = every_s
        self.first_after_s = min(first_after_s, every_s)
        self.audit = audit
        self.findings = findings
        self.runs = 0  # audits of every parent completed

    def run(self, stop: threading.Event) -> None:
        """Audit every `every_s` until `stop` is set."""
        pause = self.first_after_s
        while not stop.wait(pause):
            pause = self.every_s if self.once() else min(RETRY_AFTER_S, self.every_s)

    def once(self) -> bool:
        """Audit each parent on record, one after the other, and count the findings.
        A parent whose audit fails is skipped (logged); False if any failed."""
        try:
            parents = parents_on_record(self.service)
        except Exception as exc:  # noqa: BLE001 - the next audit tries again
            log.warning("upstream audit failed, tried again later: %s", exc)
            return False
        audits: list[Audit] = []
        for parent in parents:
            try:
                audits.append(self.audit(self.service, parent))
            except Exception as exc:  # noqa: BLE001 - the other parents are audited still
                log.warning("upstream audit of parent %s failed: %s", parent, exc)
        kinds = Counter(f.kind.value for a in audits for f in a.findings)
        if self.findings is not None:  # a failed write is logged, never raised
            self.findings.write(audits)
        metrics.observe_audit({kind.value: kinds[kind.value] for kind in Kind})
        problems = sum(len(a.problems) for a in audits)
        level = logging.WARNING if problems else logging.INFO
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "nothing"
        log.log(
            level,
            "upstream audit of %d of %d parents: %s (provisioner audit shows them)",
            len(audits),
            len(parents),
            summary,
        )
        self.runs += 1
        return len(audits) == len(parents)
