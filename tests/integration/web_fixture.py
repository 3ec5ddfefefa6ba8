"""A SQLite store for the web view's tests: the demo's brands (the in-process fake),
plus a brand whose id and title are markup, still pending, with its read models
caught up."""

from __future__ import annotations

from pathlib import Path

from infrastructure.eventstore import open_event_store
from infrastructure.gateway import HttpGateway
from infrastructure.service import ProvisioningService
from infrastructure.views import SqlViewStore
from worker.demo import run_demo
from worker.projector import Projector

HOSTILE_ID = "<script>alert(1)</script>"
HOSTILE_TITLE = "<b>Bold & Co</b>"
DEMO_BRANDS = 13  # demo-07 and -09 fail, demo-13 is deactivated, the rest are ready


def filled_store(directory: Path) -> str:
    url = f"sqlite:///{directory / 'web.sqlite'}"
    assert run_demo(brands=DEMO_BRANDS, seed=11, database_url=url) == 0
    app = open_event_store(url)
    try:
        service = ProvisioningService(app, HttpGateway("http://127.0.0.1:9", "unused"))
        service.request_provisioning(HOSTILE_ID, HOSTILE_TITLE, "org-parent")
        with SqlViewStore(url) as store:
            Projector(app, url, database_url=url).step(store)
    finally:
        app.close()
    return url
