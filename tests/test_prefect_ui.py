"""The private figures show on the run's own page in the Prefect UI, seen by a real browser.

A real local Prefect server (with its UI), one ``advise`` run and one ``governed-release`` run against it, then
headless Chromium driven over the DevTools protocol opens each run's page, on its Artifacts tab, in both UIs
Prefect 3.8 serves: V2 (the default for a browser with no saved choice, ``/v2/runs/flow-run/<id>?tab=Artifacts``)
and V1 (``/runs/flow-run/<id>``, where the tab is clicked: V1 ignores the tab in the address). It counts the
plots the page really rendered (``<img>`` elements holding a PNG, loaded, wider than 100 px). Skipped without
Debian's ``chromium``.

``KEPSILON_UI_SCREENSHOT=docs/advice-figures-in-prefect-ui.png`` also saves the V2 page of the advice run there
(the README's screenshot). Slow (about a minute): a server, two flow runs, four page loads.
"""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from kepsilon.local_server import prefect_server, stop

from .conftest import release_spec_dict

# Headless Chromium against a real server, about 60 s: `make test-heavy` (like `make audit-ui-check`).
pytestmark = [pytest.mark.server, pytest.mark.heavy]

CHROMIUM = shutil.which("chromium")
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
        yield env["PREFECT_API_URL"].removesuffix("/api"), ids, work


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
@pytest.mark.parametrize("run, plots", [("advice", 3), ("release", 2)])
@pytest.mark.parametrize("ui", ["v2", "v1"])
def test_the_runs_page_shows_its_plots_on_its_artifacts_tab(runs, run, plots, ui):
    base, ids, work = runs
    if ui == "v2":
        url, click = f"{base}/v2/runs/flow-run/{ids[run]}?tab=Artifacts", None
    else:
        url, click = f"{base}/runs/flow-run/{ids[run]}", "Artifacts"
    screenshot = os.environ.get(SCREENSHOT_ENV) if (ui, run) == ("v2", "advice") else None
    shown = Browser().count_plots(url, click, expect=plots, screenshot=Path(screenshot) if screenshot else None)
    assert shown == plots
    # The figures went to the private report folder and the run, never to the published release.
    published = work / "out" / "ui-check"
    assert sorted(p.name for p in published.iterdir()) == ["data.csv", "data.parquet", "manifest.json"]


class Browser:
    """Headless Chromium over the DevTools protocol: load a page, click a tab, count what it shows."""

    def __init__(self, width: int = 1400, height: int = 1800, timeout: float = 60):
        self.width, self.height, self.timeout = width, height, timeout

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
            await call("Page.navigate", url=url)
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
