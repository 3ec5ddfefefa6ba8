"""The web view's /workers page: each process of the deployment and each part it runs,
from their heartbeats, as `provisioner workers` lists them (worker/fleet.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from infrastructure.settings.model import Settings
from worker.fleet import ago, read_fleet


class Workers:
    """`page`: the view's page renderer (`Pages.page`: the template, `?refresh=`)."""

    def __init__(self, settings: Settings, page: Any) -> None:
        self.settings = settings
        self.page = page

    def read(self) -> dict[str, Any]:
        s = self.settings
        if s.database_url.startswith("memory:"):
            return {
                "rows": [],
                "notice": "memory:// keeps the beats in its one process: "
                "that process's /readyz shows them",
            }
        rows = read_fleet(s.database_url, s.heartbeat_max_age_s, wait_s=s.connect_wait_s)
        for row in rows:
            row["beat_ago"] = ago(row["last_beat_s"])
            answered = row["gateway_answered_s"]
            row["gateway"] = "" if answered is None else f"{ago(answered)} ago"
        return {"rows": rows, "notice": None}

    async def list(self, request: Request) -> Response:
        found = await run_in_threadpool(self.read)
        alive = sum(1 for r in found["rows"] if r["state"] == "alive")
        shown: Response = self.page(
            request,
            "workers.html",
            alive=alive,
            at=datetime.now(UTC),
            max_age=self.settings.heartbeat_max_age_s,
            **found,
        )
        return shown
