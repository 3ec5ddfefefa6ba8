"""The fake gateway over real HTTP: the contract calls, the knobs, the admin endpoints."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infrastructure.fake_gateway.config import KNOB_NAMES, FakeConfig
from infrastructure.fake_gateway.server import FakeGateway

PARENT = "org-parent"
AUTH = {"Authorization": "Bearer test-token"}
ROOT = Path(__file__).resolve().parents[2]
# The fake speaks plain HTTP; an empty TLS context spares httpx loading the CA
# bundle (about 100 ms per client here, which would dominate this module's time).
PLAIN_HTTP = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def http_client(base_url: str, **options: Any) -> httpx.Client:
    return httpx.Client(base_url=base_url, verify=PLAIN_HTTP, **options)


@pytest.fixture
def fake() -> Iterator[FakeGateway]:
    with FakeGateway() as gateway:
        yield gateway


@pytest.fixture
def client(fake: FakeGateway) -> Iterator[httpx.Client]:
    with http_client(fake.url, headers=AUTH, timeout=2.0) as http:
        yield http


def create(client: httpx.Client, title: str, parent: str = PARENT) -> httpx.Response:
    return client.post(f"/v2/workspaces/{parent}/child", json={"title": title})


def status(client: httpx.Client, workspace_id: str) -> str:
    response = client.get(f"/v1/workspaces/{workspace_id}/status")
    assert response.status_code == 200
    answer: str = response.json()["status"]
    return answer


def workspaces_titled(fake: FakeGateway, title: str) -> list[dict[str, Any]]:
    return [ws for ws in fake.state()["workspaces"] if ws["title"] == title]


# ---------------------------------------------------------------- contract calls


def test_create_answers_not_ready_then_created_after_settle_polls(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(settle_polls=2)
    response = create(client, "Brand A")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "not ready"
    assert re.fullmatch(rf"ws-{fake.id_prefix}-[0-9a-f]{{12}}", body["id"])
    assert re.fullmatch(r"[0-9a-f]{8}", fake.id_prefix)
    polls = [status(client, body["id"]) for _ in range(4)]
    assert polls == ["not ready", "not ready", "created", "created"]


def test_settle_polls_zero_means_ready_at_first_poll(client: httpx.Client) -> None:
    workspace_id = create(client, "Brand A").json()["id"]
    assert status(client, workspace_id) == "created"


def test_settle_seconds_must_pass_as_well(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(settle_s=0.2)
    workspace_id = create(client, "Brand A").json()["id"]
    assert status(client, workspace_id) == "not ready"
    time.sleep(0.25)
    assert status(client, workspace_id) == "created"


def test_family_is_a_bare_array_with_the_parent_first(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(settle_polls=5)
    first = create(client, "Brand A").json()["id"]
    second = create(client, "Brand B").json()["id"]
    response = client.get(f"/v1/workspaces/{PARENT}/family")
    assert response.status_code == 200
    family = response.json()
    assert isinstance(family, list)
    assert family[0] == {"id": PARENT, "title": f"Organisation {PARENT}", "status": "active"}
    assert [(m["id"], m["title"], m["status"]) for m in family[1:]] == [
        (first, "Brand A", "not ready"),
        (second, "Brand B", "not ready"),
    ]
    assert fake.state()["calls"]["status"] == 0  # listing is not a poll


def test_unknown_parent_is_404_on_create_and_family(client: httpx.Client) -> None:
    assert create(client, "Brand A", parent="nope").status_code == 404
    response = client.get("/v1/workspaces/nope/family")
    assert response.status_code == 404
    assert "error" in response.json()


def test_create_without_title_is_422(client: httpx.Client) -> None:
    assert client.post(f"/v2/workspaces/{PARENT}/child", json={}).status_code == 422
    assert client.post(f"/v2/workspaces/{PARENT}/child", json={"title": " "}).status_code == 422


def test_create_records_optional_resources(fake: FakeGateway, client: httpx.Client) -> None:
    resources = {"ai": {"projects": 2, "prompts": 50}}
    response = client.post(
        f"/v2/workspaces/{PARENT}/child", json={"title": "Brand A", "resources": resources}
    )
    assert response.status_code == 200
    assert workspaces_titled(fake, "Brand A")[0]["resources"] == resources


def test_list_projects_requires_type_ai(fake: FakeGateway, client: httpx.Client) -> None:
    workspace = fake.seed_workspace("Brand A", PARENT, projects=2)
    path = f"/v1/workspaces/{workspace['id']}/projects"
    assert client.get(path).status_code == 400
    assert client.get(path, params={"type": "seo"}).status_code == 400
    response = client.get(path, params={"type": "ai"})
    assert response.status_code == 200
    assert response.json() == {"items": [{"id": p} for p in workspace["projects"]]}
    assert client.get("/v1/workspaces/nope/projects", params={"type": "ai"}).status_code == 404


def test_delete_project_204_then_404(fake: FakeGateway, client: httpx.Client) -> None:
    workspace = fake.seed_workspace("Brand A", PARENT, projects=1)
    project = workspace["projects"][0]
    path = f"/v1/workspaces/{workspace['id']}/projects/{project}"
    first = client.delete(path)
    assert first.status_code == 204
    assert first.content == b""
    assert client.delete(path).status_code == 404
    assert client.delete(f"/v1/workspaces/nope/projects/{project}").status_code == 404
    assert workspaces_titled(fake, "Brand A")[0]["projects"] == []


def test_unknown_route_and_wrong_method(client: httpx.Client) -> None:
    response = client.get("/v3/whatever")
    assert response.status_code == 404
    assert "error" in response.json()
    assert client.get(f"/v2/workspaces/{PARENT}/child").status_code == 405


def test_keep_alive_connection_is_reused(fake: FakeGateway, client: httpx.Client) -> None:
    for _ in range(5):
        status(client, PARENT)
    client.get("/nope")  # an error answer keeps the connection too
    status(client, PARENT)
    pool = client._transport._pool  # type: ignore[attr-defined]
    assert len(pool.connections) == 1


# ---------------------------------------------------------------- faults


def test_missing_bearer_token_is_401(fake: FakeGateway) -> None:
    with http_client(fake.url) as anonymous:
        assert anonymous.get(f"/v1/workspaces/{PARENT}/status").status_code == 401
        assert anonymous.get("/_fake/state").status_code == 200  # admin needs no auth
    for refused in ("Bearer", "Basic dXNlcjpwdw=="):
        with http_client(fake.url, headers={"Authorization": refused}) as other:
            assert other.get(f"/v1/workspaces/{PARENT}/status").status_code == 401


def test_unauthorized_rate_hits_every_call(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(unauthorized_rate=1.0)
    assert create(client, "Brand A").status_code == 401
    assert client.get(f"/v1/workspaces/{PARENT}/status").status_code == 401
    assert client.delete(f"/v1/workspaces/{PARENT}/projects/x").status_code == 401
    assert workspaces_titled(fake, "Brand A") == []
    assert fake.state()["creates"] == {"Brand A": 1}  # received, refused


def test_throttle_rate_gives_429_on_gets_only(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(throttle_rate=1.0)
    assert client.get(f"/v1/workspaces/{PARENT}/status").status_code == 429
    assert client.get(f"/v1/workspaces/{PARENT}/family").status_code == 429
    assert create(client, "Brand A").status_code == 200


def test_server_error_rate_gives_503_on_gets_only(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(server_error_rate=1.0)
    assert client.get(f"/v1/workspaces/{PARENT}/status").status_code == 503
    workspace = fake.seed_workspace("Brand A", PARENT, projects=1)
    path = f"/v1/workspaces/{workspace['id']}/projects/{workspace['projects'][0]}"
    assert client.delete(path).status_code == 204


def test_fault_rates_are_drawn_from_the_seeded_rng() -> None:
    def run(seed: int) -> list[int]:
        config = FakeConfig(seed=seed, throttle_rate=0.5)
        with FakeGateway(config) as other, http_client(other.url, headers=AUTH) as http:
            return [http.get(f"/v1/workspaces/{PARENT}/status").status_code for _ in range(20)]

    first = run(7)
    assert first == run(7)
    assert set(first) == {200, 429}


def test_latency_applies_to_gateway_calls_not_admin(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(latency_ms=80)
    began = time.perf_counter()
    status(client, PARENT)
    assert time.perf_counter() - began >= 0.08
    began = time.perf_counter()
    client.get("/_fake/state")
    assert time.perf_counter() - began < 0.08


def test_timeout_after_create_drops_the_connection_but_creates(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(create_timeout_after_create_rate=1.0)
    with pytest.raises(httpx.RemoteProtocolError):
        create(client, "Brand A")
    assert len(workspaces_titled(fake, "Brand A")) == 1
    assert fake.state()["creates"] == {"Brand A": 1}
    assert fake.state()["creates_dropped"] == {}


def test_timeout_without_create_drops_the_connection_and_creates_nothing(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(create_timeout_without_create_rate=1.0)
    with pytest.raises(httpx.RemoteProtocolError):
        create(client, "Brand A")
    with pytest.raises(httpx.RemoteProtocolError):
        create(client, "Brand A")
    assert workspaces_titled(fake, "Brand A") == []
    assert fake.state()["creates"] == {"Brand A": 2}
    assert fake.state()["creates_dropped"] == {"Brand A": 2}


def test_hang_s_holds_the_answer_past_the_read_timeout(fake: FakeGateway) -> None:
    fake.configure(create_timeout_after_create_rate=1.0, hang_s=0.5)
    with http_client(fake.url, headers=AUTH, timeout=0.1) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            create(impatient, "Brand A")
        fake.configure(create_timeout_after_create_rate=0.0, create_timeout_without_create_rate=1)
        with pytest.raises(httpx.ReadTimeout):
            create(impatient, "Brand B")
    assert len(workspaces_titled(fake, "Brand A")) == 1
    assert workspaces_titled(fake, "Brand B") == []
    assert fake.state()["creates"] == {"Brand A": 1, "Brand B": 1}


def test_held_answer_after_create_arrives_for_a_patient_client(fake: FakeGateway) -> None:
    fake.configure(create_timeout_after_create_rate=1.0, hang_s=0.1)
    with http_client(fake.url, headers=AUTH, timeout=2.0) as patient:
        response = create(patient, "Brand A")
    assert response.status_code == 200
    assert response.json()["id"] == workspaces_titled(fake, "Brand A")[0]["id"]


def test_zombie_stays_not_ready_forever(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(zombie_rate=1.0)
    response = create(client, "Brand A")
    assert response.json()["status"] == "not ready"
    assert {status(client, response.json()["id"]) for _ in range(5)} == {"not ready"}
    assert workspaces_titled(fake, "Brand A")[0]["projects"] == []


def test_terminal_child_ends_creation_failed(fake: FakeGateway, client: httpx.Client) -> None:
    fake.configure(terminal_rate=1.0, settle_polls=1)
    workspace_id = create(client, "Brand A").json()["id"]
    assert status(client, workspace_id) == "not ready"
    assert status(client, workspace_id) == "creation_failed"


@pytest.mark.parametrize(
    ("case", "expected"),
    [("lower", "not ready"), ("upper", "NOT READY"), ("title", "Not Ready")],
)
def test_status_case(fake: FakeGateway, client: httpx.Client, case: str, expected: str) -> None:
    fake.configure(status_case=case, settle_polls=2)
    answer = create(client, "Brand A").json()
    assert answer["status"] == expected
    assert status(client, answer["id"]) == expected
    family = client.get(f"/v1/workspaces/{PARENT}/family").json()
    assert family[0]["status"] == {"lower": "active", "upper": "ACTIVE", "title": "Active"}[case]
    assert workspaces_titled(fake, "Brand A")[0]["status"] == "not ready"  # admin: as stored


def test_same_title_others_are_seeded_once_per_title(
    fake: FakeGateway, client: httpx.Client
) -> None:
    fake.configure(same_title_others=2, settle_polls=3)
    mine = create(client, "Brand A").json()["id"]
    create(client, "Brand A")
    titled = workspaces_titled(fake, "Brand A")
    others = [ws for ws in titled if ws["status"] == "created"]
    assert len(titled) == 4
    assert len(others) == 2
    assert all(len(ws["projects"]) == 1 for ws in others)
    assert mine not in {ws["id"] for ws in others}
    assert fake.state()["creates"] == {"Brand A": 2}


# ---------------------------------------------------------------- admin


def test_config_endpoint_sets_knobs_and_rejects_bad_ones(client: httpx.Client) -> None:
    response = client.post("/_fake/config", json={"settle_polls": 3, "latency_ms": 1})
    assert response.status_code == 200
    config = response.json()
    assert set(config) == set(KNOB_NAMES)
    assert config["settle_polls"] == 3
    assert config["latency_ms"] == 1.0
    unknown = client.post("/_fake/config", json={"settle_polls": 1, "no_such_knob": 1})
    assert unknown.status_code == 400
    assert "no_such_knob" in unknown.json()["error"]
    for bad in ({"zombie_rate": 1.5}, {"settle_polls": "3"}, {"status_case": "shout"}):
        assert client.post("/_fake/config", json=bad).status_code == 400
    assert client.get("/_fake/config").json()["settle_polls"] == 3  # nothing set on error


def test_fake_config_update_validates_names_and_types() -> None:
    config = FakeConfig()
    with pytest.raises(ValueError, match="bogus"):
        config.update({"bogus": 1})
    with pytest.raises(ValueError, match="settle_polls"):
        config.update({"settle_polls": 1.5})
    with pytest.raises(ValueError, match="hang_s"):
        config.update({"hang_s": True})
    with pytest.raises(ValueError, match="throttle_rate"):
        FakeConfig(throttle_rate=-0.1)
    config.update({"settle_s": 1, "seed": 3})
    assert config.settle_s == 1.0
    assert isinstance(config.settle_s, float)


def test_reset_keeps_the_parents_and_their_projects(
    fake: FakeGateway, client: httpx.Client
) -> None:
    before = fake.state()["workspaces"]
    assert len(before) == 1
    assert len(before[0]["projects"]) == 1
    create(client, "Brand A")
    client.post("/_fake/workspaces", json={"title": "Other org", "parent": None})
    fake.configure(settle_polls=4)
    assert client.post("/_fake/reset").status_code == 200
    after = fake.state()
    assert after["workspaces"] == before
    assert after["creates"] == {}
    assert set(after["calls"].values()) == {0}
    assert client.get("/_fake/config").json()["settle_polls"] == 4  # config is kept


def test_state_document(fake: FakeGateway, client: httpx.Client) -> None:
    workspace_id = create(client, "Brand A").json()["id"]
    status(client, workspace_id)
    client.get(f"/v1/workspaces/{PARENT}/family")
    state = client.get("/_fake/state").json()
    assert state == fake.state()
    assert state["calls"] == {
        "create": 1,
        "status": 1,
        "family": 1,
        "list_projects": 0,
        "delete_project": 0,
    }
    child = next(ws for ws in state["workspaces"] if ws["id"] == workspace_id)
    assert child["parent"] == PARENT
    assert child["status"] == "created"
    assert child["created_at"].endswith("+00:00")


def test_admin_seeds_workspaces_and_projects(fake: FakeGateway, client: httpx.Client) -> None:
    seeded = client.post(
        "/_fake/workspaces",
        json={"title": "Brand A", "parent": PARENT, "status": "locked", "projects": 1},
    )
    assert seeded.status_code == 200
    workspace = seeded.json()
    assert status(client, workspace["id"]) == "locked"
    added = client.post(f"/_fake/workspaces/{workspace['id']}/projects")
    assert added.status_code == 200
    listed = client.get(f"/v1/workspaces/{workspace['id']}/projects", params={"type": "ai"})
    assert [item["id"] for item in listed.json()["items"]] == [
        workspace["projects"][0],
        added.json()["id"],
    ]
    top = client.post("/_fake/workspaces", json={"title": "Org 2", "parent": None}).json()
    assert create(client, "Brand A", parent=top["id"]).status_code == 200
    assert client.post("/_fake/workspaces/nope/projects").status_code == 404
    missing = {"title": "X", "parent": "nope"}
    assert client.post("/_fake/workspaces", json=missing).status_code == 404
    with pytest.raises(KeyError):
        fake.add_project("nope")


def test_ids_are_reproducible_for_a_seed_only_without_the_prefix_per_start() -> None:
    def ids(seed: int, id_prefix: str | None = "") -> list[str]:
        config = FakeConfig(seed=seed)
        with (
            FakeGateway(config, parents=("p1", "p2"), id_prefix=id_prefix) as other,
            http_client(other.url, headers=AUTH) as http,
        ):
            return [create(http, f"T{i}", parent="p2").json()["id"] for i in range(3)]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)
    assert all(re.fullmatch(r"ws-[0-9a-f]{12}", found) for found in ids(1))
    first, again = ids(1, None), ids(1, None)  # restarted: a new prefix, new ids
    assert not set(first) & set(again)
    assert [found.rsplit("-", 1)[1] for found in first] == [
        found.rsplit("-", 1)[1] for found in again
    ]  # the seed's draws, under another prefix


def test_command_line_serves_until_sigterm() -> None:
    command = [sys.executable, "-m", "infrastructure.fake_gateway", "--port", "0"]
    command += ["--parent", "p1", "--parent", "p2", "--settle-polls", "2", "--status-case", "upper"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"fake gateway listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        with http_client(match.group(1), timeout=2.0) as http:
            config = http.get("/_fake/config").json()
            ids = [ws["id"] for ws in http.get("/_fake/state").json()["workspaces"]]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=5)
        assert proc.returncode == 0
    assert config["settle_polls"] == 2
    assert config["status_case"] == "upper"
    assert ids == ["p1", "p2"]
    assert stderr.strip().endswith("provisioner.process fake-gateway stopped (SIGTERM)"), stderr


def test_command_line_ids_repeat_across_restarts_only_with_a_seed() -> None:
    def first_id(*flags: str) -> str:
        command = [sys.executable, "-m", "infrastructure.fake_gateway", "--port", "0", *flags]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:  # fmt: skip
            assert proc.stdout is not None
            url = proc.stdout.readline().rsplit(" ", 1)[1].strip()
            with http_client(url, headers=AUTH, timeout=2.0) as http:
                made: str = create(http, "Brand A").json()["id"]
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=5) == 0
        return made

    assert first_id() != first_id()
    assert first_id("--seed", "5") == first_id("--seed", "5")


def test_scripted_titles_get_their_fate_instead_of_a_random_draw() -> None:
    with FakeGateway(parents=("p",)) as fake:
        fake.script("Z", "zombie")
        fake.script("S", "slow:2")
        with pytest.raises(ValueError, match="fate"):
            fake.script("X", "explode")
        headers = {"Authorization": "Bearer t"}
        with httpx.Client(base_url=fake.url, headers=headers) as client:
            zombie = client.post("/v2/workspaces/p/child", json={"title": "Z"}).json()["id"]
            slow = client.post("/v2/workspaces/p/child", json={"title": "S"}).json()["id"]
            polls = [client.get(f"/v1/workspaces/{slow}/status").json()["status"] for _ in range(3)]
            for _ in range(5):
                assert client.get(f"/v1/workspaces/{zombie}/status").json()["status"] == "not ready"
            answer = client.post("/_fake/scripts", json={"S": ""})
        assert polls == ["not ready", "not ready", "created"]
        assert answer.json() == {"Z": "zombie"}


def test_scripted_terminal_statuses_of_each_kind_and_the_faults_played_are_counted() -> None:
    kinds = ("creation_failed", "failed", "error", "invalid subscription")
    with FakeGateway(parents=("p",)) as fake:
        for kind in kinds:
            fake.script(f"T {kind}", kind)
        fake.configure(throttle_rate=1.0)
        headers = {"Authorization": "Bearer t"}
        with httpx.Client(base_url=fake.url, headers=headers) as client:
            made = {
                kind: client.post("/v2/workspaces/p/child", json={"title": f"T {kind}"}).json()
                for kind in kinds
            }
            throttled = client.get(f"/v1/workspaces/{made['error']['id']}/status").status_code
            fake.configure(throttle_rate=0.0)
            settled = {
                kind: client.get(f"/v1/workspaces/{answer['id']}/status").json()["status"]
                for kind, answer in made.items()
            }
        faults = fake.state()["faults"]
    assert throttled == 429
    assert settled == {kind: kind for kind in kinds}
    assert faults == {"throttled": 1, **{f"terminal:{kind}": 1 for kind in kinds}}


def test_provisioner_fake_gateway_takes_every_knob_and_refuses_a_bad_one() -> None:
    from click.testing import CliRunner

    from infrastructure.fake_gateway.config import KNOB_NAMES
    from worker.cli.main import main

    runner = CliRunner()
    shown = runner.invoke(main, ["fake-gateway", "--help"])
    assert shown.exit_code == 0
    for name in KNOB_NAMES:
        assert "--" + name.replace("_", "-") in shown.output
    refused = runner.invoke(main, ["fake-gateway", "--port", "0", "--zombie-rate", "2"])
    assert refused.exit_code == 2
    assert "zombie_rate is a rate between 0 and 1" in refused.output


def test_state_reports_the_id_prefix_its_ids_carry(fake: FakeGateway, client: httpx.Client) -> None:
    made = create(client, "Brand A").json()["id"]
    state = client.get("/_fake/state").json()

    assert re.fullmatch(r"[0-9a-f]{8}", state["id_prefix"])
    assert state["id_prefix"] == fake.id_prefix
    assert made.startswith(f"ws-{state['id_prefix']}-")
    with FakeGateway(id_prefix="") as plain, http_client(plain.url, timeout=2.0) as http:
        assert http.get("/_fake/state").json()["id_prefix"] == ""
    with FakeGateway() as other:
        assert other.state()["id_prefix"] not in ("", state["id_prefix"])  # one per start


def test_a_workspace_can_refuse_its_project_deletes_for_good(
    fake: FakeGateway, client: httpx.Client
) -> None:
    workspace = fake.seed_workspace("Brand A", PARENT, projects=2)
    wid, [first, second] = workspace["id"], workspace["projects"]
    assert workspace["refuse_deletes"] is None
    body = {"status": 409, "message": "project locked by a legal hold"}

    answered = client.post(f"/_fake/workspaces/{wid}/refuse-deletes", json=body)
    refused = [client.delete(f"/v1/workspaces/{wid}/projects/{p}") for p in (first, "prj-nope")]

    assert answered.status_code == 200
    assert answered.json()["refuse_deletes"] == body
    assert [r.status_code for r in refused] == [409, 409]
    assert refused[0].json() == {"error": "project locked by a legal hold"}
    state = fake.state()
    [shown] = [ws for ws in state["workspaces"] if ws["id"] == wid]
    assert shown["projects"] == [first, second]  # nothing deleted
    assert shown["refuse_deletes"] == body
    assert state["calls"]["delete_project"] == 2
    assert state["faults"] == {"delete_refused": 2}
    # Another workspace deletes as before; 0 ends the refusal.
    other = fake.seed_workspace("Brand B", PARENT, projects=1)
    [kept] = other["projects"]
    assert client.delete(f"/v1/workspaces/{other['id']}/projects/{kept}").status_code == 204
    ended = client.post(f"/_fake/workspaces/{wid}/refuse-deletes", json={"status": 0})
    assert ended.json()["refuse_deletes"] is None
    assert client.delete(f"/v1/workspaces/{wid}/projects/{first}").status_code == 204


def test_refused_deletes_take_a_4xx_but_gone_and_throttled_and_a_reset_ends_them(
    fake: FakeGateway, client: httpx.Client
) -> None:
    wid = fake.seed_workspace("Brand A", PARENT, projects=1)["id"]
    path = f"/_fake/workspaces/{wid}/refuse-deletes"
    bad = [{"status": s} for s in (404, 429, 500, 204, 409.0, "409", True)]
    bad += [{}, {"status": 409, "message": 7}, {"status": 409, "why": "x"}]

    answers = [client.post(path, json=body).status_code for body in bad]
    unknown = client.post("/_fake/workspaces/nope/refuse-deletes", json={"status": 409})
    default = fake.refuse_deletes(PARENT, 422)  # in process; the parent too

    assert answers == [400] * len(bad)
    assert unknown.status_code == 404
    assert default["refuse_deletes"] == {
        "status": 422,
        "message": f"project deletes refused in workspace {PARENT}",
    }
    project = default["projects"][0]
    assert client.delete(f"/v1/workspaces/{PARENT}/projects/{project}").status_code == 422
    with pytest.raises(KeyError):
        fake.refuse_deletes("nope")
    with pytest.raises(ValueError, match="4xx"):
        fake.refuse_deletes(wid, 404)
    fake.reset()
    [parent] = fake.state()["workspaces"]
    assert parent["refuse_deletes"] is None
    assert client.delete(f"/v1/workspaces/{PARENT}/projects/{project}").status_code == 204
