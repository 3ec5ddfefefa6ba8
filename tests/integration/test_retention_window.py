"""The retention window as an operator sees it: the web view's brand page says when
a deactivated brand's workspace is to be emptied."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from infrastructure.service import ProvisioningService
from infrastructure.settings.engine import EngineSettings
from infrastructure.settings.model import Settings
from infrastructure.store.eventstore import open_event_store
from infrastructure.views.store import SqlViewStore
from tests.conftest import PARENT
from worker.projector import Projector
from worker.web.app import create_app


def test_the_brand_page_says_when_the_workspace_is_to_be_emptied(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.sqlite'}"
    app = open_event_store(url)
    try:
        settings = EngineSettings(decommission_delay_s=3600.0)
        service = ProvisioningService(app, None, settings=settings)  # type: ignore[arg-type]
        attempt_id = service.request_provisioning("b-kept", "Kept Co", PARENT)
        brand = service.brand("b-kept")
        brand.bind("ws-kept", attempt_id)
        app.save(brand)
        due = service.deactivate("b-kept").to_be_emptied_at
        with SqlViewStore(url) as store:
            store.setup()
            Projector(app, url, database_url=url).step(store)
    finally:
        app.close()
    web = create_app(Settings.from_env({"PROVISIONER_DATABASE_URL": url}))

    with TestClient(web, base_url="http://127.0.0.1:8080") as client:
        page = client.get("/brands/b-kept").text

    assert due is not None
    assert "status-deactivated" in page
    assert f"to be emptied at {due.isoformat()}" in page
