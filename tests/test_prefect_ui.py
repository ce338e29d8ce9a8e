"""The private figures show on the run's own page in the Prefect UI, seen by a real browser.

A real local Prefect server (with its UI), one ``advise`` run and one ``governed-release`` run against it, then
headless Chromium driven over the DevTools protocol opens each run's page, on its Artifacts tab, in both UIs
Prefect 3.8 serves: V2 (the default for a browser with no saved choice, ``/v2/runs/flow-run/<id>?tab=Artifacts``)
and V1 (``/runs/flow-run/<id>``, where the tab is clicked: V1 ignores the tab in the address). It counts the
plots the page really rendered (``<img>`` elements holding a PNG, loaded, wider than 100 px). Skipped without
Debian's ``chromium``.

``KEPSILON_UI_SCREENSHOT=docs/advice-figures-in-prefect-ui.png`` also saves the V2 page of the advice run there
(the screenshot in docs/advise.md). Slow (about a minute): a server, two flow runs, four page loads.

The second part (below) submits the deployments' "Custom run" forms under ``deployments/serve.sh`` in both UIs,
untouched and edited, and waits for the runs (about nine minutes on a loaded machine).
"""

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from kepsilon.local_server import prefect_server, stop
from kepsilon.prefect_login import authorization_header, read_auth_string

from .conftest import ROOT, release_spec_dict

# Headless Chromium against a real server, about 60 s: `make test-heavy` (like `make audit-ui-check`).
pytestmark = [pytest.mark.server, pytest.mark.heavy]

CHROMIUM = shutil.which("chromium") or ""  # empty: not installed, the browser tests are skipped
SCREENSHOT_ENV = "KEPSILON_UI_SCREENSHOT"

RUN_BOTH = """
import json, os, sys
from kepsilon.audit.ledger import set_cap
from kepsilon.audit.store import open_store
from kepsilon.flows.advise import AdviceRequest, advise
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

spec = parse_spec(json.loads(sys.argv[1]))
store = open_store(os.environ["KEPSILON_AUDIT_DB"])
set_cap(store, spec.population_id, 5.0, by="test-officer", reason="UI test")
advise(AdviceRequest(spec=spec, draws=3))
(event,) = store["advice_events"].rows
record = governed_release(spec)
print(json.dumps({"advice": event["flow_run_id"], "release": record["execution"]["flow_run_id"]}))
"""

# Prefect's login form (both UIs, shown while the browser holds no accepted login): a password input.
LOGIN_SHOWN = "!!document.querySelector('input[type=password]')"
# Fill the form as a person does (the native value setter, then an input event: React and Vue both listen)
# and submit it: the form's own submit, else its button.
LOG_IN = """((secret) => {
    const input = document.querySelector('input[type=password]');
    if (!input) return 'no login form';
    Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(input, secret);
    input.dispatchEvent(new Event('input', {bubbles: true}));
    input.dispatchEvent(new Event('change', {bubbles: true}));
    const form = input.closest('form');
    const button = (form || document).querySelector('button[type=submit]')
        || [...document.querySelectorAll('button')].find(b => /log ?in|sign ?in|submit/i.test(b.textContent));
    if (button) { button.click(); return 'clicked'; }
    if (form) { form.requestSubmit(); return 'submitted'; }
    return 'no button';
})(%s)"""


async def log_in(call, evaluate, url: str, login: str | None, timeout: float = 60) -> bool:
    """Open ``url`` and log in through the UI's own form, then open ``url`` again; whether a form was shown.

    V2 shows its login form on any page of a browser without an accepted login. V1 shows the page's frame
    with an "Authentication failed." notice and no data; its form is at ``/login``, where a person goes. With
    ``login`` None the page is left as an unauthenticated visitor sees it.
    """
    await call("Page.navigate", url=url)
    deadline = time.monotonic() + timeout
    shown = await _login_form_within(evaluate, seconds=10)
    if login is None:
        return shown
    if not shown:
        base = url.split("/", 3)
        await call("Page.navigate", url=f"{base[0]}//{base[2]}/login")
        shown = await _login_form_within(evaluate, seconds=20)
        if not shown:
            return False
    assert await evaluate(LOG_IN % json.dumps(login)) in ("clicked", "submitted")
    while await evaluate(LOGIN_SHOWN):
        assert time.monotonic() < deadline, "the login form stayed after logging in"
        await asyncio.sleep(0.5)
    await asyncio.sleep(1)
    await call("Page.navigate", url=url)
    return shown


async def _login_form_within(evaluate, seconds: float) -> bool:
    for _ in range(int(seconds)):
        await asyncio.sleep(1)
        if await evaluate(LOGIN_SHOWN):
            return True
    return False


# What an unauthenticated visitor is shown instead of the run: the login form (V2) or V1's notice.
REFUSED_SHOWN = """!!document.querySelector('input[type=password]')
    || document.body.innerText.includes('Authentication failed')"""


# The plots a page shows: PNG <img>s the browser loaded and laid out wider than an icon.
SHOWN_PLOTS = """[...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/png')
    && i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 100).length"""

CLICK_TAB = """(() => { const tab = [...document.querySelectorAll('[role=tab], li.p-tab, button')]
    .find(e => e.textContent.trim() === %s); if (tab) tab.click(); return !!tab; })()"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A live Prefect server with one advice run and one release run on it: (UI base URL, run ids)."""
    work = tmp_path_factory.mktemp("prefect-ui")
    spec = release_spec_dict(
        "paper-synthetic", release_id="ui-check", population_id="ui-population", output_dir=str(work / "out")
    )
    with prefect_server(work / "prefect") as env:
        env = {
            **env,
            "KEPSILON_AUDIT_DB": str(work / "audit.db"),
            "KEPSILON_SEED_KEY_FILE": str(work / "seed.key"),
            "KEPSILON_REPORTS_DIR": str(work / "reports"),
        }
        env.pop("KEPSILON_DEFAULT_CAP", None)
        done = subprocess.run(
            [sys.executable, "-c", RUN_BOTH, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        ids = json.loads(done.stdout.strip().splitlines()[-1])
        yield env["PREFECT_API_URL"].removesuffix("/api"), ids, work, env["PREFECT_API_AUTH_STRING"]


@pytest.mark.skipif(not CHROMIUM, reason="needs Debian's chromium")
@pytest.mark.parametrize("run, plots", [("advice", 3), ("release", 2)])
@pytest.mark.parametrize("ui", ["v2", "v1"])
def test_the_runs_page_shows_its_plots_on_its_artifacts_tab(runs, run, plots, ui):
    base, ids, work, login = runs
    if ui == "v2":
        url, click = f"{base}/v2/runs/flow-run/{ids[run]}?tab=Artifacts", None
    else:
        url, click = f"{base}/runs/flow-run/{ids[run]}", "Artifacts"
    screenshot = os.environ.get(SCREENSHOT_ENV) if (ui, run) == ("v2", "advice") else None
    browser = Browser(login=login)
    shown = browser.count_plots(url, click, expect=plots, screenshot=Path(screenshot) if screenshot else None)
    assert browser.login_form_shown  # the server requires its login; the browser logged in through the UI's form
    assert shown == plots
    # The figures went to the private report folder and the run, never to the published release.
    published = work / "out" / "ui-check"
    assert sorted(p.name for p in published.iterdir()) == ["data.csv", "data.parquet", "manifest.json"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
@pytest.mark.parametrize("ui", ["v2", "v1"])
def test_a_visitor_without_the_login_gets_the_login_form_and_no_run(runs, ui):
    """The same page, no login: the UI shows its login form and nothing of the run (its API calls answer 401)."""
    base, ids, _, _ = runs
    url = f"{base}/v2/runs/flow-run/{ids['advice']}?tab=Artifacts" if ui == "v2" else f"{base}/runs/flow-run/{ids['advice']}"
    browser = Browser(login=None, timeout=10)
    assert browser.count_plots(url, None, expect=3) == 0
    assert browser.refusal_shown


class Browser:
    """Headless Chromium over the DevTools protocol: load a page, click a tab, count what it shows."""

    def __init__(self, width: int = 1400, height: int = 1800, timeout: float = 60, login: str | None = None):
        self.width, self.height, self.timeout = width, height, timeout
        self.login = login
        self.login_form_shown = False
        self.refusal_shown = False

    def count_plots(self, url: str, click: str | None, expect: int, screenshot: Path | None = None) -> int:
        port = _free_port()
        profile = tempfile.mkdtemp(prefix="kepsilon-chromium-")
        browser = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--disable-background-networking", "--disable-dev-shm-usage", f"--remote-debugging-port={port}",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            return asyncio.run(self._session(_page_socket(port), url, click, expect, screenshot))
        finally:
            stop(browser, seconds=10)
            shutil.rmtree(profile, ignore_errors=True)

    async def _session(self, socket_url: str, url: str, click: str | None, expect: int, screenshot: Path | None) -> int:
        import websockets

        async with websockets.connect(socket_url, max_size=2**28) as connection:
            calls = iter(range(1, 1_000_000))

            async def call(method: str, **params):
                number = next(calls)
                await connection.send(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    message = json.loads(await connection.recv())
                    if message.get("id") == number:
                        return message.get("result", {})

            async def evaluate(expression: str):
                return (await call("Runtime.evaluate", expression=expression, returnByValue=True)).get("result", {}).get("value")

            await call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1, mobile=False)
            self.login_form_shown = await log_in(call, evaluate, url, self.login)
            deadline = time.monotonic() + self.timeout
            clicked = click is None
            shown = 0
            while time.monotonic() < deadline:
                await asyncio.sleep(1)
                if not clicked:
                    clicked = bool(await evaluate(CLICK_TAB % json.dumps(click)))
                    continue
                shown = await evaluate(SHOWN_PLOTS) or 0
                if shown >= expect:
                    break
            await asyncio.sleep(1)  # let the last images settle before counting again and capturing
            shown = await evaluate(SHOWN_PLOTS) or 0
            self.refusal_shown = bool(await evaluate(REFUSED_SHOWN))
            if screenshot is not None:
                import base64

                screenshot.write_bytes(base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"]))
            return shown


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _page_socket(port: int, seconds: float = 30) -> str:
    """The DevTools websocket of the browser's first page, once it answers."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=1) as response:
                pages = [p for p in json.load(response) if p.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("chromium did not open its DevTools port")


# ---------------------------------------------------------------------------------------------------------
# The deployments' "Custom run" forms, submitted in a real browser against `make serve` (issue 22).
#
# deployments/serve.sh, exactly as `make serve` runs it, from a throw-away project folder (links to this
# checkout's .venv, flows, data and deployments) so that the runs publish under that folder's out/ and keep
# their private files (Prefect home, audit store, seed key, reports) in a 0700 folder of the test's. For each
# UI (V2 at /v2/…, V1 at /…) and each deployment, the form is submitted untouched, then with k and ε edited
# (for the advice: the first k and ε of its grid); both runs must complete, and the store's record of each
# must hold the values the form showed.

FORM_SCREENSHOT_ENV = "KEPSILON_FORM_SCREENSHOT"
DEPLOYMENT_IDS = {"release": "governed-release/paper-synthetic-nightly", "advice": "advise/paper-synthetic-advice"}

# The input that belongs to a field's label (the UIs add " (Optional)" to some): the first input or textarea after the label's text, inside the
# nearest ancestor holding one (both UIs put a field's label and its input in one block). A React or Vue
# input is changed through the native value setter, then told by an input event.
SET_FIELD = """((label, index, value) => {
    const labels = [...document.querySelectorAll('label, span, div, p')]
        .filter(e => [...e.childNodes].some(n => n.nodeType === 3 && [label, label + ' (Optional)'].includes(n.textContent.trim())));
    if (!labels.length) return 'no label ' + label;
    let block = labels[0], inputs = [];
    while (block && !(inputs = [...block.querySelectorAll('input:not([type=checkbox]), textarea')]).length) block = block.parentElement;
    const input = inputs[index];
    if (!input) return 'no input for ' + label;
    const proto = input instanceof HTMLTextAreaElement ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(input, value);
    input.dispatchEvent(new Event('input', {bubbles: true}));
    input.dispatchEvent(new Event('change', {bubbles: true}));
    input.dispatchEvent(new Event('blur', {bubbles: true}));
    return input.value;
})(%s, %d, %s)"""

HAS_SUBMIT = "[...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'Submit')"
CLICK_SUBMIT = """(() => { const buttons = [...document.querySelectorAll('button')].filter(b => b.textContent.trim() === 'Submit');
    buttons[buttons.length - 1].click(); return buttons.length; })()"""
# What the page says when it refuses the form (a toast, an alert, a field's error).
PAGE_ERRORS = """[...document.querySelectorAll('[role=alert], [data-sonner-toast], .p-toast, .p-message, .text-destructive')]
    .map(e => e.textContent.trim()).filter(Boolean).join(' | ')"""

# The edits per deployment: label, which input under it (a grid's first entry), the new value.
EDITS = {
    "release": [("k: smallest group size", 0, "7"), ("ε per record", 0, "0.5")],
    "advice": [("k values to compare", 0, "7"), ("ε values to compare", 0, "0.5")],
}


class Served:
    """deployments/serve.sh running from a throw-away project folder: its URLs, folders and environment."""

    def __init__(self, work: Path):
        self.project = work / "project"
        self.private = work / "private"
        self.project.mkdir()
        self.private.mkdir(mode=0o700)
        for name in (".venv", "flows", "data", "deployments"):
            (self.project / name).symlink_to(ROOT / name)
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            key: value for key, value in os.environ.items()
            if not key.startswith(("PREFECT_", "KEPSILON_"))
        }
        self.env.update(
            PREFECT_PORT=str(self.port),
            PREFECT_HOME=str(self.private / "prefect"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_RESULTS_PERSIST_BY_DEFAULT="false",
            DO_NOT_TRACK="1",
            GX_ANALYTICS_ENABLED="false",
            KEPSILON_AUDIT_DB=str(self.private / "audit.db"),
            KEPSILON_AUDIT_HEAD_LOG=str(self.private / "head.log"),
            KEPSILON_SEED_KEY_FILE=str(self.private / "seed.key"),
            KEPSILON_REPORTS_DIR=str(self.private / "reports"),
            KEPSILON_PREFECT_AUTH_FILE=str(self.private / "prefect-server.auth"),
        )
        self.process: subprocess.Popen | None = None

    @property
    def login(self) -> str:
        """The login serve.sh generated for its server (kept in the private folder)."""
        login = read_auth_string(self.private / "prefect-server.auth")
        assert login is not None
        return login

    def api(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(
            f"{self.base}/api{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json", **authorization_header(self.login)},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def kepsilon(self, *args: str) -> subprocess.CompletedProcess:
        """A `kepsilon` command run in the project folder with make serve's environment; must succeed."""
        done = subprocess.run([str(ROOT / ".venv" / "bin" / "kepsilon"), *args], cwd=self.project, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kepsilon {' '.join(args)}: {done.stderr[-1000:]}"
        return done

    def prepare(self) -> None:
        """The store before make serve starts: a cap for the deployments' population."""
        self.kepsilon("audit", "set-cap", "paper-synthetic-people", "10", "--by", "ui-test", "--reason", "UI rerun test")

    def start(self, seconds: float = 240) -> None:
        self.prepare()
        log = open(self.private / "serve.log", "w")
        self.process = subprocess.Popen(
            [str(self.project / "deployments" / "serve.sh")], cwd=self.project, env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if "Ctrl-C stops the worker" in (self.private / "serve.log").read_text():
                return
            time.sleep(1)
        raise AssertionError("make serve did not come up:\n" + (self.private / "serve.log").read_text()[-3000:])

    def deployment_id(self, name: str) -> str:
        return self.api("GET", f"/deployments/name/{DEPLOYMENT_IDS[name]}")["id"]

    def wait_final(self, flow_run_id: str, seconds: float = 900) -> dict:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            run = self.api("GET", f"/flow_runs/{flow_run_id}")
            if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return run
            time.sleep(2)
        return self.api("GET", f"/flow_runs/{flow_run_id}")

    def stop(self) -> None:
        stop(self.process, seconds=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(tmp_path_factory.mktemp("make-serve"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def submit_form(url: str, edits: list[tuple[str, int, str]], login: str, screenshot: Path | None = None) -> str:
    """Open a custom-run page, apply ``edits``, press Submit; the id of the flow run the server created."""
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="kepsilon-chromium-")
    browser = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--disable-dev-shm-usage", f"--remote-debugging-port={port}", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        return asyncio.run(_submit(_page_socket(port), url, edits, login, screenshot))
    finally:
        stop(browser, seconds=10)
        shutil.rmtree(profile, ignore_errors=True)


async def _submit(socket_url: str, url: str, edits, login: str, screenshot: Path | None, timeout: float = 90) -> str:
    import base64

    import websockets

    async with websockets.connect(socket_url, max_size=2**28) as connection:
        calls = iter(range(1, 1_000_000))
        created: list[str] = []  # request ids of the POSTs to create_flow_run
        answers: dict[str, int] = {}

        def note(message: dict) -> None:
            params = message.get("params", {})
            if message.get("method") == "Network.requestWillBeSent" and params["request"]["url"].endswith("/create_flow_run"):
                created.append(params["requestId"])
            if message.get("method") == "Network.responseReceived" and params["requestId"] in created:
                answers[params["requestId"]] = params["response"]["status"]

        async def call(method: str, **params):
            number = next(calls)
            await connection.send(json.dumps({"id": number, "method": method, "params": params}))
            while True:
                message = json.loads(await connection.recv())
                if message.get("id") == number:
                    return message.get("result", {})
                note(message)

        async def evaluate(expression: str):
            return (await call("Runtime.evaluate", expression=expression, returnByValue=True)).get("result", {}).get("value")

        await call("Network.enable")
        await call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        assert await log_in(call, evaluate, url, login), "make serve's UI asked for no login"
        deadline = time.monotonic() + timeout
        while not await evaluate(HAS_SUBMIT):
            assert time.monotonic() < deadline, f"no Submit button on {url}"
            await asyncio.sleep(1)
        await asyncio.sleep(2)  # the form initialises its fields from the schema's defaults after it renders
        for label, index, value in edits:
            assert await evaluate(SET_FIELD % (json.dumps(label), index, json.dumps(value))) == value, label
        await asyncio.sleep(1)
        if screenshot is not None:
            screenshot.write_bytes(base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"]))
        for _attempt in range(3):
            assert await evaluate(CLICK_SUBMIT)
            while not answers:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the form was not submitted: {await evaluate(PAGE_ERRORS)!r}")
                await asyncio.sleep(0.5)
                await evaluate("1")  # lets the events that arrived meanwhile be read
            (request_id, status), = answers.items()
            body = (await call("Network.getResponseBody", requestId=request_id))["body"]
            if status != 503:
                break
            # Prefect's SQLite server answers 503 ("database is locked") under load; a person presses again.
            answers.clear()
            await asyncio.sleep(3)
        assert status == 201, f"create_flow_run answered {status}: {body[:500]}"
        return json.loads(body)["id"]


@pytest.mark.skipif(not CHROMIUM, reason="needs Debian's chromium")
@pytest.mark.parametrize("deployment", ["release", "advice"])
@pytest.mark.parametrize("ui", ["v2", "v1"])
def test_the_custom_run_form_submits_untouched_and_edited_and_both_runs_complete(served, ui, deployment):
    deployment_id = served.deployment_id(deployment)
    url = f"{served.base}{'/v2' if ui == 'v2' else ''}/deployments/deployment/{deployment_id}/run"
    screenshot = os.environ.get(FORM_SCREENSHOT_ENV) if (ui, deployment) == ("v2", "release") else None
    untouched = submit_form(url, [], served.login, screenshot=Path(screenshot) if screenshot else None)
    edited = submit_form(url, EDITS[deployment], served.login)
    runs = {name: served.wait_final(run_id) for name, run_id in (("untouched", untouched), ("edited", edited))}
    assert {name: run["state_type"] for name, run in runs.items()} == {"untouched": "COMPLETED", "edited": "COMPLETED"}, (
        (served.private / "serve.log").read_text()[-4000:]
    )
    store = sqlite3.connect(served.env["KEPSILON_AUDIT_DB"])
    if deployment == "release":
        recorded = dict(
            (run_id, (k, epsilon)) for run_id, k, epsilon in store.execute(
                "SELECT flow_run_id, k, epsilon FROM releases WHERE outcome = 'published' AND flow_run_id IN (?, ?)",
                (untouched, edited),
            )
        )
        assert recorded == {untouched: (10, 1.0), edited: (7, 0.5)}
    else:
        recorded = dict(
            (run_id, (json.loads(k_values), json.loads(epsilon_values))) for run_id, k_values, epsilon_values in store.execute(
                "SELECT flow_run_id, k_values, epsilon_values FROM advice_events WHERE flow_run_id IN (?, ?)", (untouched, edited)
            )
        )
        # The advisor records its grid sorted and without repeats: the edit replaced k = 2 and ε = 0.05.
        assert recorded == {
            untouched: ([2, 5, 10, 20, 50, 100], [0.05, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]),
            edited: ([5, 7, 10, 20, 50, 100], [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]),
        }
