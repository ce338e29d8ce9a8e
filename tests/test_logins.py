"""The logins of the servers kepsilon starts (issue 26.4), against real servers: an unauthenticated client gets
nothing from a Prefect server (flow-run creation, artifact read, the events websocket) and the UI asks for the
login; with the login, the same requests work. make serve's secret is generated once, printed once, owner-only.

The Prefect server is the session's (``prefect_server_env``), started by ``kepsilon.local_server`` exactly as
the CLI's throw-away servers are. The officers' Datasette has its own tests (test_audit_datasette.py); the
browser's login to the Prefect UI is in test_prefect_ui.py (heavy).
"""

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kepsilon.prefect_login import authorization_header

from .conftest import ROOT

pytestmark = pytest.mark.server

SECRET_FIGURE = "linking risk 0.0123456"


def _api(env: dict, method: str, path: str, body=None, login: str | None = "session") -> tuple[int, Any]:
    """One API call; ``login``: "session" for the server's login, None for none, or another string."""
    auth = env["PREFECT_API_AUTH_STRING"] if login == "session" else login
    request = urllib.request.Request(
        env["PREFECT_API_URL"] + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **authorization_header(auth)},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


@pytest.fixture(scope="module")
def flow_id(prefect_server_env) -> str:
    status, flow = _api(prefect_server_env, "POST", "/flows/", {"name": f"login-test-{uuid.uuid4().hex[:8]}"})
    assert status in (200, 201), flow
    return flow["id"]


def _runs_of(env: dict, flow: str) -> int:
    status, count = _api(env, "POST", "/flow_runs/count", {"flows": {"id": {"any_": [flow]}}})
    assert status == 200, count
    return count


@pytest.mark.parametrize("login", [None, "kepsilon:wrong-password", ""], ids=["none", "wrong", "empty"])
def test_flow_run_creation_without_the_login_is_refused_and_creates_nothing(prefect_server_env, flow_id, login):
    before = _runs_of(prefect_server_env, flow_id)
    status, answer = _api(prefect_server_env, "POST", "/flow_runs/", {"flow_id": flow_id, "name": "intruder"}, login=login)
    assert status == 401, answer
    assert _runs_of(prefect_server_env, flow_id) == before  # counted with the login: nothing was created
    status, run = _api(prefect_server_env, "POST", "/flow_runs/", {"flow_id": flow_id, "name": "officer"})
    assert status == 201 and run["flow_id"] == flow_id
    assert _runs_of(prefect_server_env, flow_id) == before + 1


def test_artifact_read_without_the_login_is_refused(prefect_server_env):
    key = f"private-figures-{uuid.uuid4().hex[:8]}"
    status, artifact = _api(prefect_server_env, "POST", "/artifacts/", {"key": key, "type": "markdown", "data": SECRET_FIGURE})
    assert status == 201, artifact
    for method, path, body in (("GET", f"/artifacts/{artifact['id']}", None), ("POST", "/artifacts/filter", {}),
                               ("GET", f"/artifacts/{key}/latest", None)):
        status, answer = _api(prefect_server_env, method, path, body, login=None)
        assert status == 401 and SECRET_FIGURE not in str(answer), path
    status, read = _api(prefect_server_env, "GET", f"/artifacts/{artifact['id']}")
    assert status == 200 and read["data"] == SECRET_FIGURE


def test_the_ui_asks_for_the_login_and_only_health_answers_without_it(prefect_server_env):
    base = prefect_server_env["PREFECT_API_URL"].removesuffix("/api")
    with urllib.request.urlopen(base + "/ui-settings", timeout=10) as response:
        assert json.load(response)["auth"] == "BASIC"  # the UI shows its login form (test_prefect_ui.py logs in)
    for path in ("/admin/version", "/openapi.json", "/docs", "/flows/filter", "/deployments/filter", "/work_pools/filter"):
        method = "POST" if path.endswith("filter") else "GET"
        assert _api(prefect_server_env, method, path, {} if method == "POST" else None, login=None)[0] == 401, path
    assert _api(prefect_server_env, "GET", "/health", login=None)[0] == 200  # a liveness probe, nothing else


async def _subscribe(api_url: str, path: str, subprotocols, first_message, event_name: str | None, seconds: float,
                     emit=None):
    """Connect to a websocket; send ``first_message``, then the filter, then ``emit()`` the event (in a thread);
    what came back, or how the connection was refused or closed."""
    import websockets

    url = api_url.replace("http://", "ws://") + path
    try:
        async with websockets.connect(url, subprotocols=subprotocols, open_timeout=10) as connection:
            if first_message is not None:
                await connection.send(json.dumps(first_message))
            received = []
            if event_name:
                now = datetime.now(UTC)
                await connection.send(json.dumps({"type": "filter", "filter": {
                    "event": {"name": [event_name]},
                    "occurred": {"since": (now - timedelta(hours=1)).isoformat(), "until": (now + timedelta(hours=1)).isoformat()},
                }}))
            if emit is not None:
                await asyncio.sleep(1)
                await asyncio.to_thread(emit)
            while True:
                received.append(json.loads(await asyncio.wait_for(connection.recv(), seconds)))
                if event_name and any(m.get("event", {}).get("event") == event_name for m in received):
                    return "open", received
    except TimeoutError:
        return "timeout", received
    except websockets.exceptions.InvalidStatus as refused:
        return f"refused {refused.response.status_code}", []
    except websockets.exceptions.ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
        return f"closed {code}", []


def _emit(env: dict, event_name: str) -> None:
    event = {"id": str(uuid.uuid4()), "occurred": datetime.now(UTC).isoformat(), "event": event_name,
             "resource": {"prefect.resource.id": "kepsilon.login-test"}, "payload": {"figure": SECRET_FIGURE}}
    status, answer = _api(env, "POST", "/events", [event])
    assert status == 204, answer


@pytest.mark.parametrize(
    ("subprotocols", "first"),
    [(None, None), (["prefect"], {"type": "auth", "token": None}), (["prefect"], {"type": "auth", "token": "kepsilon:wrong"}),
     (["prefect"], {"type": "filter"})],
    ids=["no-auth-handshake", "no-token", "wrong-token", "filter-first"],
)
def test_the_events_websocket_refuses_a_subscriber_without_the_login(prefect_server_env, subprotocols, first):
    """Prefect 3.2 left this websocket open (PrefectHQ/prefect#17687); at the pinned 3.8 it checks the login."""
    event_name = f"kepsilon.login-test.{uuid.uuid4().hex[:8]}"
    api = prefect_server_env["PREFECT_API_URL"]
    outcome, received = asyncio.run(_subscribe(api, "/events/out", subprotocols, first, event_name, seconds=5,
                                               emit=lambda: _emit(prefect_server_env, event_name)))
    assert outcome in ("refused 403", "closed 1002", "closed 1008"), (outcome, received)
    assert SECRET_FIGURE not in json.dumps(received)
    # the logs stream and the events intake refuse the same way
    for path in ("/logs/out", "/events/in"):
        outcome, _ = asyncio.run(_subscribe(api, path, subprotocols, first, None, seconds=5))
        assert outcome in ("refused 403", "closed 1002", "closed 1008"), (path, outcome)


def test_the_events_websocket_serves_a_subscriber_with_the_login(prefect_server_env):
    event_name = f"kepsilon.login-test.{uuid.uuid4().hex[:8]}"
    login = {"type": "auth", "token": prefect_server_env["PREFECT_API_AUTH_STRING"]}
    outcome, received = asyncio.run(_subscribe(prefect_server_env["PREFECT_API_URL"], "/events/out", ["prefect"], login,
                                               event_name, seconds=20, emit=lambda: _emit(prefect_server_env, event_name)))
    assert outcome == "open" and received[0] == {"type": "auth_success"}
    assert any(m.get("event", {}).get("payload", {}).get("figure") == SECRET_FIGURE for m in received)


def test_make_serve_secret_is_generated_once_printed_once_and_owner_only(tmp_path):
    auth_file = tmp_path / "private" / "prefect-server.auth"
    env = {**os.environ, "KEPSILON_PREFECT_AUTH_FILE": str(auth_file)}
    command = [sys.executable, "-m", "kepsilon.prefect_login", "secret"]
    first = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    second = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    secret = first.stdout.strip()
    assert secret.startswith("kepsilon:") and len(secret) > 40
    assert second.stdout.strip() == secret  # kept: every later make serve and client reads the same
    assert secret in first.stderr and secret not in second.stderr  # printed once
    assert auth_file.stat().st_mode & 0o777 == 0o600 and auth_file.parent.stat().st_mode & 0o777 == 0o700
    assert auth_file.read_text().strip() == secret
