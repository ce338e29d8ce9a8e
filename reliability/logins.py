"""Reliability scenario of issue 26 (items 4 and 5): the servers' logins under unauthenticated attacks.

After a real CLI release against the run's Prefect server (which requires its login, as every server kepsilon
starts does), an attacker without the login tries, against that server:

1. to create a flow run of the release flow (``POST /flow_runs/``, with and without a wrong login),
2. to read the run's artifacts (the private figures) by id, by key and by filter,
3. to subscribe to the events websocket (and the logs websocket), with and without Prefect's handshake,
4. to reach the API pages the UI loads (the UI itself asks for the login: ``/ui-settings``),

then, against the officers' Datasette served over the same store as ``make audit-ui`` serves it:

5. every canned query (HTML, JSON, CSV), every table, arbitrary SQL, the file download, the ``/-/`` pages,
6. a password guess, timed (the login answers a wrong password after a pause).

Each attempt must be refused (401/403, a closed websocket, a redirect to the login form) with nothing of the
store, the run or the figures in the answer, no flow run created and no ε ledger entry added; the same
requests with the login must work (the control). Also: the CLI's own throw-away server requires its per-run
secret. Figures (attempts, refusals, seconds per guess) go to the report's counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from kepsilon.audit import officers, queries
from kepsilon.local_server import LocalServer, free_port, stop
from kepsilon.prefect_login import authorization_header

from .harness import BIN, ROOT, Results, kepsilon, set_cap, spec_dict, write_spec

CATEGORY = "logins"
WEBSOCKET_REFUSALS = ("refused 403", "closed 1002", "closed 1008")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _http(url: str, method: str = "GET", body=None, headers: dict | None = None, opener=None) -> tuple[int, bytes]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, method=method, data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with (opener or urllib.request.build_opener(_NoRedirect)).open(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _ledger_entries(store: Path) -> int:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]


async def _websocket(url: str, subprotocols, first_message) -> str:
    import websockets

    try:
        async with websockets.connect(url, subprotocols=subprotocols, open_timeout=10) as connection:
            if first_message is not None:
                await connection.send(json.dumps(first_message))
            await connection.send(json.dumps({"type": "filter", "filter": {}}))
            message = json.loads(await asyncio.wait_for(connection.recv(), 5))
            return "open" if message.get("type") == "auth_success" else f"answered {message.get('type')}"
    except TimeoutError:
        return "open, silent"
    except websockets.exceptions.InvalidStatus as refused:
        return f"refused {refused.response.status_code}"
    except websockets.exceptions.ConnectionClosed as closed:
        return f"closed {closed.rcvd.code if closed.rcvd else None}"


def logins_scenario(results: Results, env: dict, work: Path, source: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    private = work / "private"
    run_env = {**env, "KEPSILON_AUDIT_DB": str(private / "audit.db"), "KEPSILON_SEED_KEY_FILE": str(private / "seed.key"),
               "KEPSILON_REPORTS_DIR": str(work / "reports")}
    set_cap(run_env, work, 5.0)
    spec = spec_dict(work, "logins", source={**spec_dict(work, "logins")["source"], "path": str(source)},
                     suppression_budget=1.0, max_linking_risk=1.0)
    done = kepsilon(["release", str(write_spec(work, spec))], run_env, work)
    results.add(CATEGORY, "the release reports to a server that requires its login, and publishes",
                done.returncode == 0, f"exit {done.returncode}")
    store = private / "audit.db"
    attempts = {"prefect": 0, "prefect refused": 0, "websocket": 0, "websocket refused": 0}
    _prefect_attacks(results, env, store, attempts)
    _own_server(results, work)
    datasette = _datasette_attacks(results, work, store)
    results.counts["logins: unauthenticated attempts"] = (
        f"Prefect API {attempts['prefect refused']}/{attempts['prefect']} refused; websockets "
        f"{attempts['websocket refused']}/{attempts['websocket']} refused; Datasette "
        f"{datasette['refused']}/{datasette['attempts']} refused; a wrong password answered in "
        f"{datasette['guess_seconds']:.2f} s (≤ {3600 / max(datasette['guess_seconds'], 1e-9):.0f} guesses an hour per connection)"
    )


def _prefect_attacks(results: Results, env: dict, store: Path, attempts: dict) -> None:
    api = env["PREFECT_API_URL"]
    login = authorization_header(env["PREFECT_API_AUTH_STRING"])
    wrong = authorization_header("kepsilon:guessed")
    status, flows = _http(f"{api}/flows/filter", "POST", {"flows": {"name": {"any_": ["governed-release"]}}}, login)
    flow_ids = [flow["id"] for flow in json.loads(flows)] if status == 200 else []
    results.add(CATEGORY, "control: with the login the release flow is listed", bool(flow_ids), f"status {status}")
    flow_id = flow_ids[0] if flow_ids else "00000000-0000-0000-0000-000000000000"

    def count_runs() -> int:
        status, body = _http(f"{api}/flow_runs/count", "POST", {"flows": {"id": {"any_": [flow_id]}}}, login)
        return int(json.loads(body)) if status == 200 else -1

    runs_before, ledger_before = count_runs(), _ledger_entries(store)
    status, artifacts = _http(f"{api}/artifacts/filter", "POST", {}, login)
    private_figures = [a for a in json.loads(artifacts) if a.get("data")] if status == 200 else []
    results.add(CATEGORY, "control: with the login the run's artifacts (private figures) are readable",
                bool(private_figures), f"{len(private_figures)} artifacts")
    for name, headers in (("no login", {}), ("a wrong login", wrong)):
        probes: list[tuple[str, str, str, object]] = [
            (f"flow-run creation with {name}", "POST", "/flow_runs/", {"flow_id": flow_id, "name": "intruder"}),
            (f"artifact filter with {name}", "POST", "/artifacts/filter", {}),
            (f"flow-run read with {name}", "POST", "/flow_runs/filter", {}),
            (f"the API's schema with {name}", "GET", "/openapi.json", None),
        ]
        probes += [(f"artifact read by id with {name}", "GET", f"/artifacts/{a['id']}", None) for a in private_figures[:3]]
        probes += [(f"artifact read by key with {name}", "GET", f"/artifacts/{a['key']}/latest", None)
                   for a in private_figures[:3] if a.get("key")]
        for case, method, path, body in probes:
            status, answer = _http(api + path, method, body, headers)
            attempts["prefect"] += 1
            leaked = any(str(a["data"])[:40] in answer.decode(errors="replace") for a in private_figures)
            refused = status == 401 and not leaked
            attempts["prefect refused"] += refused
            results.add(CATEGORY, f"refused: {case}", refused, f"status {status}")
    results.add(CATEGORY, "no flow run was created and no ε ledger entry added by the attempts",
                count_runs() == runs_before and _ledger_entries(store) == ledger_before,
                f"runs {runs_before}→{count_runs()}, ledger {ledger_before}→{_ledger_entries(store)}")
    with urllib.request.urlopen(api.removesuffix("/api") + "/ui-settings", timeout=10) as response:
        results.add(CATEGORY, "the UI asks for the login (ui-settings: auth BASIC)", json.load(response).get("auth") == "BASIC")

    socket_url = api.replace("http://", "ws://")
    for path in ("/events/out", "/logs/out", "/events/in", "/task_runs/subscriptions/scheduled"):
        for case, subprotocols, first in (("no handshake", None, None),
                                          ("no token", ["prefect"], {"type": "auth", "token": None}),
                                          ("a wrong token", ["prefect"], {"type": "auth", "token": "kepsilon:guessed"})):
            outcome = asyncio.run(_websocket(socket_url + path, subprotocols, first))
            attempts["websocket"] += 1
            attempts["websocket refused"] += outcome in WEBSOCKET_REFUSALS
            results.add(CATEGORY, f"websocket {path} refused with {case}", outcome in WEBSOCKET_REFUSALS, outcome)
    outcome = asyncio.run(_websocket(socket_url + "/events/out", ["prefect"],
                                     {"type": "auth", "token": env["PREFECT_API_AUTH_STRING"]}))
    results.add(CATEGORY, "control: the events websocket accepts the login", outcome.startswith("open"), outcome)


def _own_server(results: Results, work: Path) -> None:
    """The CLI's own server (no make serve, no PREFECT_API_URL) requires a secret of its own."""
    server = LocalServer(work / "own-server.log")
    server.start()
    try:
        refused = _http(f"{server.api_url}/admin/version")[0]
        accepted = _http(f"{server.api_url}/admin/version", headers=authorization_header(server.auth_string))[0]
        results.add(CATEGORY, "the CLI's own server refuses a client without its per-run secret",
                    refused == 401 and accepted == 200, f"without {refused}, with {accepted}")
    finally:
        server.stop()


def _datasette_attacks(results: Results, work: Path, store: Path) -> dict:
    accounts = work / "private" / "audit-ui-accounts.json"
    password = "reliability officer's password"
    officers.set_password("officer", password, accounts)
    ui_store = work / "ui" / "audit.db"  # the canned queries attach to a database named "audit"
    ui_store.parent.mkdir(mode=0o700, exist_ok=True)
    with sqlite3.connect(store) as source, sqlite3.connect(ui_store) as copy:
        source.backup(copy)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(BIN / "datasette"), "serve", str(ui_store), "--metadata", str(ROOT / "audit" / "datasette.yaml"),
         "--plugins-dir", str(ROOT / "audit" / "datasette_plugins"), "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, officers.ENV_ACCOUNTS: str(accounts)}, stdout=subprocess.DEVNULL,
        stderr=open(work / "datasette.log", "wb"), start_new_session=True,
    )
    figures = {"attempts": 0, "refused": 0, "guess_seconds": 0.0}
    try:
        deadline = time.monotonic() + 90
        while _status(base + "/-/login") != 200:
            if time.monotonic() > deadline or process.poll() is not None:
                results.add(CATEGORY, "the officers' Datasette starts", False, (work / "datasette.log").read_text()[-300:])
                return figures
            time.sleep(0.3)
        with sqlite3.connect(ui_store) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        paths = ["/", "/audit", "/audit.json", "/audit.db", "/audit.json?sql=select+*+from+ledger", "/-/versions.json",
                 "/-/metadata.json", "/-/databases.json", "/-/actor.json", "/-/permissions", "/-/messages"]
        for name in queries.QUERIES:
            paths += [f"/audit/{name}?population=reliability-people&release=logins",
                      f"/audit/{name}.json?population=reliability-people&release=logins",
                      f"/audit/{name}.csv?population=reliability-people&release=logins"]
        paths += [f"/audit/{table}.json" for table in tables]
        leaks = []
        for path in paths:
            status, body = _http(base + path, headers={"Content-Type": "text/plain"})
            figures["attempts"] += 1
            refused = status in (302, 401) and b"reliability-people" not in body and b"logins" not in body
            figures["refused"] += refused
            if not refused:
                leaks.append(f"{path}: {status}")
        results.add(CATEGORY, f"Datasette: every page, table, JSON/CSV endpoint and canned query refused without a login "
                              f"({len(paths)} requests)", not leaks, "; ".join(leaks[:5]))
        officer = _Session(base)
        started = time.monotonic()
        status = officer.log_in("officer", "guessed password")
        figures["guess_seconds"] = time.monotonic() - started
        figures["attempts"] += 1
        figures["refused"] += status == 401
        results.add(CATEGORY, "Datasette: a wrong password is refused", status == 401 and officer.actor() is None,
                    f"status {status}")
        status = officer.log_in("officer", password)
        answer = officer.get("/audit/budget.json?_shape=array&population=reliability-people")
        spent = json.loads(answer[1])[0]["spent_lifetime"] if answer[0] == 200 else None
        results.add(CATEGORY, "control: the officer logs in and the budget question answers from the store",
                    status == 302 and spent is not None and spent > 0, f"login {status}, query {answer[0]}, spent {spent}")
    finally:
        stop(process, seconds=10)
    return figures


def _status(url: str) -> int:
    try:
        return _http(url)[0]
    except OSError:
        return 0


class _Session:
    """An officer's cookie jar, logged in through the form."""

    def __init__(self, base: str):
        import http.cookiejar

        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def get(self, path: str) -> tuple[int, bytes]:
        return _http(self.base + path, opener=self.opener)

    def log_in(self, name: str, password: str) -> int:
        status, page = self.get("/-/login")
        found = re.search(rb'name="csrftoken" value="([^"]+)"', page)
        if found is None:
            raise AssertionError(f"GET /-/login answered {status} without a csrftoken field")
        token = found.group(1).decode()
        form = urllib.parse.urlencode({"csrftoken": token, "username": name, "password": password, "next": "/"}).encode()
        return _http(self.base + "/-/login", "POST", form, {"Content-Type": "application/x-www-form-urlencoded"},
                     opener=self.opener)[0]

    def actor(self) -> str | None:
        return next((c.value for c in self.jar if c.name == "ds_actor"), None)
