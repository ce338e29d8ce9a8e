"""End-to-end check of the officers' read-only browser: Datasette + canned queries, seen by headless Chromium.

Builds a small audit store through the real API in a temporary folder, serves it with
``datasette serve <store> --metadata audit/datasette.yaml`` on a free port, and opens every one of the thirteen
officers' questions (governance.md's ten, question 4 in two parts, the chain head behind ``verify``, who ran the
advisor, and the releases with homogeneous groups or failed diversity checks) in
headless Chromium. Each page must:

- render without an error message,
- show the answer before any SQL (the canned queries hide their SQL behind a "show" link),
- show exactly the expected rows (only the named cells are compared).

The browser logs in first, through the officers' login form (``/-/login``, an account made for the check), as an
officer does; without the login no question answers.

It also checks what an officer must not be able to do or be misled by: a question about one population asked
without one gives no row (not a row of zeros), the policy question with empty fields applies the CLI's
defaults, the sealed-seed table is neither listed nor viewable, and Datasette refuses a write. A screenshot of
every page is written for a person to look at. Exit code 0 when every check passes.

    .venv/bin/python scripts/audit_ui_check.py [--chromium chromium] [--screenshots DIR] [--metadata FILE] [--keep]
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METADATA = ROOT / "audit" / "datasette.yaml"
PLUGINS = ROOT / "audit" / "datasette_plugins"  # the read-only plugin: writes answer 405
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
S1, S2 = "1" * 64, "2" * 64
DIAMETER = "data-derived (class diameter, the paper's method)"


def build_store(path: Path, checkpoint: Path) -> None:
    """Six releases of population 'adult' (cap ε 1.0, δ 1e-5), written in the flow's order of calls.

    R1 (ε 0.4) run by bob, approved by carol, published with 3 homogeneous groups; R2 (ε 0.2, k 3, public bounds, source S2, numpy 2.4.5)
    self-approved; R3 (ε 0.1) failed after its noise, then rerun from its unsealed seed and published;
    R4 (ε 0.1) drew its noise twice and failed its k-anonymity check; R6 (ε 0.05, δ 1e-6) in the DP mode;
    R5 (ε 0.5) refused over the cap.
    A checkpoint is exported at the end.
    """
    from kepsilon.audit.advice import record_advice
    from kepsilon.audit.approvals import approve
    from kepsilon.audit.chain import write_checkpoint
    from kepsilon.audit.ledger import BudgetExceeded, mark_noise_drawn, reserve, set_cap
    from kepsilon.audit.records import record_release
    from kepsilon.audit.seeds import seal_seed, unseal_seed
    from kepsilon.audit.store import open_store

    def manifest(release, key, *, k=5, epsilon, basis="diameter", source=S1, numpy="2.4.6", checks=True, homogeneous=0,
                 dp=None):
        return {
            **({"privacy_model": "dp", "dp": dp} if dp else {"privacy_model": "kepsilon"}),
            "disclosure": {"homogeneous_groups": homogeneous, "l_diversity_min": 1 if homogeneous else 2,
                           "t_closeness_max": 0.5, "prosecutor_risk": 0.2},
            "release_id": release, "population_id": "adult", "idempotency_key": key, "spec_hash": key[-1] * 64,
            "k": k, "epsilon": epsilon, "scale_basis": basis, "mechanism": "laplace", "algorithm": "mondrian",
            "source": {"path": "adult.csv", "sha256": source, "rows": 100},
            "checks": [{"name": "k_anonymity", "success": checks}],
            "software": {"kepsilon": "0.1.0", "numpy": numpy, "git_commit": "abc123"},
            "execution": {"operator": "bob", "flow_run_id": f"run-{release}"},
        }

    def drawn(release, key, epsilon):
        seal_seed(db, idempotency_key=key, release_id=release, seed=os.urandom(32))
        reservation = reserve(db, population_id="adult", epsilon=epsilon, idempotency_key=key, release_id=release,
                              operator="bob")
        mark_noise_drawn(db, reservation.id)
        return reservation

    db = open_store(path)
    set_cap(db, "adult", 1.0, "alice", "initial policy", delta=1e-5)
    r1 = drawn("R1", "k1", 0.4)
    record_release(db, manifest("R1", "k1", epsilon=0.4, homogeneous=3), outcome="published", reservation_id=r1.id)
    approve(db, release_id="R1", spec_hash="1" * 64, approver="carol", reason="reviewed")
    r2 = drawn("R2", "k2", 0.2)
    record_release(db, manifest("R2", "k2", k=3, epsilon=0.2, basis="bounds", source=S2, numpy="2.4.5"),
                   outcome="published", reservation_id=r2.id)
    approve(db, release_id="R2", spec_hash="2" * 64, approver="bob", reason="self-approved")
    r3 = drawn("R3", "k3", 0.1)
    record_release(db, {**manifest("R3", "k3", epsilon=0.1), "error": "publish interrupted"}, outcome="failed",
                   reservation_id=r3.id)
    rerun = reserve(db, population_id="adult", epsilon=0.1, idempotency_key="k3", release_id="R3", operator="bob")
    unseal_seed(db, idempotency_key="k3", by="kepsilon-flow", reason="rerun of interrupted release")
    mark_noise_drawn(db, rerun.id)
    record_release(db, manifest("R3", "k3", epsilon=0.1), outcome="published", reservation_id=rerun.id)
    r4 = drawn("R4", "k4", 0.1)
    mark_noise_drawn(db, r4.id, redraw=True)
    record_release(db, manifest("R4", "k4", epsilon=0.1, checks=False), outcome="failed", reservation_id=r4.id)
    seal_seed(db, idempotency_key="k6", release_id="R6", seed=os.urandom(32))
    r6 = reserve(db, population_id="adult", epsilon=0.05, idempotency_key="k6", release_id="R6", operator="bob",
                 delta=1e-6)
    mark_noise_drawn(db, r6.id)
    record_release(db, manifest("R6", "k6", k=74, epsilon=0.05, basis=None, dp={"delta": 1e-6, "beta": 0.04}),
                   outcome="published", reservation_id=r6.id)
    try:
        reserve(db, population_id="adult", epsilon=0.5, idempotency_key="k5", release_id="R5", operator="bob")
        raise AssertionError("R5 should exceed the cap")
    except BudgetExceeded as refused:
        record_release(db, {"release_id": "R5", "idempotency_key": "k5", "error": str(refused)}, outcome="refused",
                       reservation_id=None)
    record_advice(db, population_id="adult", spec_hash="6" * 64, source_sha256=S1, source_rows=100, actor="erin",
                  via="cli", k_values=[5, 10], epsilon_values=[0.5, 1.0], draws=10)
    write_checkpoint(db, checkpoint)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"datasette exited with code {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    raise RuntimeError("datasette did not answer in time")


OFFICER, PASSWORD = "audit-ui-check", "a password only this check knows"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def officer_opener(base: str) -> urllib.request.OpenerDirector:
    """A urllib client logged in as the check's officer through the form /-/login (cookies kept)."""
    import http.cookiejar

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect)
    page = opener.open(f"{base}/-/login", timeout=10).read().decode()
    found = re.search(r'name="csrftoken" value="([^"]+)"', page)
    if found is None:
        raise RuntimeError("the login page carries no csrftoken field")
    token = found.group(1)
    form = urllib.parse.urlencode({"csrftoken": token, "username": OFFICER, "password": PASSWORD, "next": "/"}).encode()
    try:
        opener.open(urllib.request.Request(f"{base}/-/login", data=form, method="POST"), timeout=30)
    except urllib.error.HTTPError as answer:
        if answer.code != 302:
            raise RuntimeError(f"the officer's login answered {answer.code}") from None
    return opener


def http_status(url: str, opener: urllib.request.OpenerDirector | None = None) -> int:
    try:
        with (opener or urllib.request.build_opener(_NoRedirect)).open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


class Browser:
    """Headless Chromium over the DevTools protocol, logged in once through the login form like an officer."""

    def __init__(self, binary: str, profile: Path):
        self.binary, self.profile = binary, profile

    def visit(self, base: str, pages: dict[str, str], shots: Path) -> tuple[dict[str, str], bool]:
        """Log in, then each page: its DOM after scripts ran, and a screenshot; and whether the form was asked for."""
        import asyncio

        port = free_port()
        process = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}",
             "--window-size=1280,1400", "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            return asyncio.run(self._session(port, base, pages, shots))
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()

    async def _session(self, port: int, base: str, pages: dict[str, str], shots: Path):
        import asyncio
        import base64
        import json

        import websockets

        socket_url = None
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=1) as response:
                    listed = [p for p in json.load(response) if p.get("type") == "page"]
                if listed:
                    socket_url = listed[0]["webSocketDebuggerUrl"]
                    break
            except OSError:
                pass
            await asyncio.sleep(0.2)
        if socket_url is None:
            raise RuntimeError("chromium did not open its DevTools port")
        async with websockets.connect(socket_url, max_size=2**28) as connection:
            numbers = iter(range(1, 1_000_000))

            async def call(method: str, **params):
                number = next(numbers)
                await connection.send(json.dumps({"id": number, "method": method, "params": params}))
                while True:
                    message = json.loads(await connection.recv())
                    if message.get("id") == number:
                        return message.get("result", {})

            async def evaluate(expression: str):
                answer = await call("Runtime.evaluate", expression=expression, returnByValue=True)
                return answer.get("result", {}).get("value")

            async def load(url: str) -> None:
                await call("Page.navigate", url=url)
                for _ in range(100):
                    await asyncio.sleep(0.2)
                    if await evaluate("document.readyState") == "complete":
                        break
                await asyncio.sleep(0.5)

            await call("Emulation.setDeviceMetricsOverride", width=1280, height=1400, deviceScaleFactor=1, mobile=False)
            # The first page, unauthenticated, must be the login form; it is filled and submitted as a person does.
            first = next(iter(pages.values()))
            await load(base + first)
            asked = bool(await evaluate("!!document.querySelector('form[action=\"/-/login\"] input[type=password]')"))
            await evaluate(f"""(() => {{ document.querySelector('#officer').value = {json.dumps(OFFICER)};
                document.querySelector('#password').value = {json.dumps(PASSWORD)};
                document.querySelector('form[action="/-/login"]').submit(); }})()""")
            for _ in range(50):
                await asyncio.sleep(0.2)
                if not (await evaluate("location.pathname")).startswith("/-/login"):
                    break
            doms = {}
            for name, path in pages.items():
                await load(base + path)
                doms[name] = await evaluate("document.documentElement.outerHTML")
                shot = await call("Page.captureScreenshot", format="png")
                (shots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
            return doms, asked


def table_rows(dom: str) -> list[dict[str, str]]:
    """The rows of Datasette's results table as {column: cell text}; [] when the page has no table."""
    if '<table class="rows-and-columns">' not in dom:
        return []
    body = dom.split('<table class="rows-and-columns">', 1)[1].split("</table>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[-1], flags=re.S):
        cells = re.findall(r'<td class="col-([^"]+)">(.*?)</td>', row, flags=re.S)
        rows.append({column: html.unescape(re.sub(r"<[^>]+>", "", text)).strip() for column, text in cells})
    return rows


def page_problems(dom: str) -> list[str]:
    """What makes a canned query page wrong whatever its rows: an error, no answer, or SQL above the answer."""
    problems = []
    error = re.search(r'<p class="message-error">(.*?)</p>', dom, flags=re.S)
    if error:
        problems.append(f"error shown: {html.unescape(error.group(1)).strip()[:200]}")
    answer = min((dom.find(marker) for marker in ('<table class="rows-and-columns">', '<p class="zero-results">')
                  if marker in dom), default=-1)
    if answer < 0:
        problems.append("no answer (neither a result table nor '0 results')")
    sql = min((dom.find(marker) for marker in ('id="sql-query"', 'id="sql-editor"') if marker in dom), default=-1)
    if sql >= 0 and (answer < 0 or sql < answer):
        problems.append("the SQL block stands above the answer")
    if 'class="show-hide-sql"' not in dom:
        problems.append("no link to show the SQL")
    return problems


def expected_pages(chain_entries: int, head_hash: str, checkpoint_entries: int) -> dict[str, tuple[str, list[dict]]]:
    """Every officers' question (and the misleading cases of issue 10) with the rows its page must show."""
    return {
        "budget": ("/audit/budget?population=adult",
                   [{"population_id": "adult", "cap": "1.0", "spent_lifetime": "0.95", "remaining": "0.05",
                     "dp_epsilon": "0.05", "dp_delta": "1e-06", "kepsilon_mode_epsilon": "0.9",
                     "delta_cap": "1e-05", "delta_remaining": "9e-06", "cap_entries": "1"}]),
        "budget-empty": ("/audit/budget", []),
        "policy-defaults": ("/audit/policy", [{"release_id": "R2", "k": "3", "breach": "k below policy"}]),
        "policy": ("/audit/policy?min_k=&max_epsilon=0.3",
                   [{"release_id": "R1", "breach": "epsilon above policy"},
                    {"release_id": "R2", "breach": "k below policy"}]),
        "who": ("/audit/who?release=R2",
                [{"release_id": "R2", "operator": "bob", "approver": "bob", "same_person": "yes"}]),
        "who-empty": ("/audit/who", []),
        "provenance": ("/audit/provenance?release=R2",
                       [{"release_id": "R2", "source_rows": "100", "git_commit": "abc123"}]),
        "impact": ("/audit/impact?version=numpy%3D2.4.5", [{"release_id": "R2"}]),
        "release_list": ("/audit/release_list?population=",
                         [{"release_id": r, "status": status} for r, status in
                          [("R5", "refused"), ("R6", "published"), ("R4", "failed"), ("R3", "published"),
                           ("R3", "failed"), ("R2", "published"), ("R1", "published")]]),
        "population_list": ("/audit/population_list", [{"population_id": "adult", "epsilon_left": "0.05"}]),
        "reruns": ("/audit/reruns?only=shared",
                   [{"idempotency_key": "k3", "release_id": "R3", "runs": "2", "outcomes": "failed,published"}]),
        "noise_draws": ("/audit/noise_draws",
                        [{"idempotency_key": "k4", "release_id": "R4", "noise_draws": "2", "epsilon_charged": "0.2"}]),
        "failures": ("/audit/failures",
                     [{"release_id": "R3", "outcome": "failed"}, {"release_id": "R4", "outcome": "failed"},
                      {"release_id": "R5", "outcome": "refused"}]),
        "diversity": ("/audit/diversity",
                      [{"release_id": "R1", "homogeneous_groups": "3", "l_diversity_min": "1"}]),
        "scale_basis": ("/audit/scale_basis?basis=bounds", [{"release_id": "R2", "noise_scale": "public bounds"}]),
        "scale_basis-dp": ("/audit/scale_basis?basis=any",
                           [{"release_id": r, "noise_scale": scale} for r, scale in
                            [("R1", DIAMETER), ("R2", "public bounds"), ("R3", DIAMETER), ("R3", DIAMETER),
                             ("R4", DIAMETER), ("R6", "none: DP mode (nothing noised; sampling and safe k-anonymisation)"),
                             ("R5", "not recorded")]]),
        "unseals": ("/audit/unseals",
                    [{"release_id": "R3", "actor": "kepsilon-flow", "commitment_verified": "yes"}]),
        "advice": ("/audit/advice?population=adult", [{"population_id": "adult", "actor": "erin", "via": "cli"}]),
        "chain_head": ("/audit/chain_head",
                       [{"entries": str(chain_entries), "head_hash": head_hash,
                         "last_checkpoint_entries": str(checkpoint_entries)}]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    parser.add_argument("--screenshots", type=Path, help="folder for the pages' screenshots (kept; default: inside the temporary folder)")
    parser.add_argument("--metadata", type=Path, default=METADATA, help="Datasette metadata (default: audit/datasette.yaml)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    from kepsilon.audit import queries
    from kepsilon.audit.chain import chain_head, read_checkpoint, verify_chain
    from kepsilon.audit.store import open_store

    work = Path(tempfile.mkdtemp(prefix="kepsilon-audit-ui-"))
    shots = args.screenshots or work / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    os.environ["KEPSILON_SEED_KEY_FILE"] = str(work / "seed.key")
    os.environ.pop("KEPSILON_SEED_KEY", None)
    store = work / "audit.db"  # the file's stem names the database the metadata's canned queries attach to
    build_store(store, work / "checkpoint.json")
    db = open_store(store)
    intact, problems = verify_chain(db, work / "checkpoint.json")
    entries, head = chain_head(db)
    db.close()
    if not intact:
        print(f"the built store does not verify: {problems}")
        return 1
    pages = expected_pages(entries, head, read_checkpoint(work / "checkpoint.json")["entry_count"])
    asked = {path.split("?")[0].rsplit("/", 1)[-1] for path, _ in pages.values()}
    if asked != set(queries.QUERIES):
        print(f"the check does not open every question: missing {sorted(set(queries.QUERIES) - asked)}")
        return 1

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    datasette = [
        str(Path(sys.executable).with_name("datasette")), "serve", str(store),
        "--metadata", str(args.metadata), "--plugins-dir", str(PLUGINS), "--host", "127.0.0.1", "--port", str(port),
    ]
    from kepsilon.audit import officers

    accounts = work / "private" / "audit-ui-accounts.json"
    officers.set_password(OFFICER, PASSWORD, accounts)
    server = subprocess.Popen(datasette, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, officers.ENV_ACCOUNTS: str(accounts)})
    failures: list[str] = []

    def report(name: str, where: str, problems: list[str]) -> None:
        print(f"{name:16} {where:44} {'ok' if not problems else 'FAILED: ' + '; '.join(problems)}")
        if problems:
            failures.append(name)

    try:
        wait_until_up(f"{base}/-/login", server)
        visits = {name: path for name, (path, _) in pages.items()} | {"database": "/audit"}
        doms, login_asked = Browser(args.chromium, work / "profile").visit(base, visits, shots)
        report("login", "/-/login", [] if login_asked else ["the first page did not ask for the officer's login"])
        for name, (path, expected) in pages.items():
            dom = doms[name]
            problems = page_problems(dom)
            shown = table_rows(dom)
            picked = [{column: row.get(column) for column in want} for row, want in zip(shown, expected)]
            if len(shown) != len(expected) or picked != expected:
                problems.append(f"rows shown {shown}, expected {expected}")
            report(name, path, problems)

        # The sealed seeds: not listed among the tables, and refused as a table view or its JSON.
        dom = doms["database"]
        problems = ["listed on the database page"] if "sealed_seeds" in dom else []
        if "/audit/budget" not in dom:  # every table is hidden now: the page must still list the questions
            problems.append("database page lists no canned queries (cannot tell hidden from broken)")
        officer = officer_opener(base)
        for path in ("/audit/sealed_seeds", "/audit/sealed_seeds.json", "/audit/releases.json",
                     "/audit.json?sql=" + urllib.parse.quote("select * from sealed_seeds")):
            if (status := http_status(base + path, officer)) != 403:
                problems.append(f"{path} answered {status}, not 403")
        report("sealed_seeds", "/audit, /audit/sealed_seeds", problems)

        # No SQL at all, reads or writes: the SQL page is refused.
        write = urllib.parse.quote("DELETE FROM ledger")
        status = http_status(f"{base}/audit?sql={write}", officer)
        report("write", "/audit?sql=DELETE FROM ledger",
               [] if status in (400, 403) else [f"answered {status}, not 400 or 403"])
        # Without the login: no question answers (a redirect to the form, or 401 for JSON).
        anonymous = {path: http_status(base + path) for path in ("/audit/budget?population=adult",
                                                                 "/audit/budget.json?population=adult", "/audit")}
        report("no login", "questions without a login",
               [f"{path} answered {status}" for path, status in anonymous.items() if status not in (302, 401)])
    finally:
        server.terminate()
        server.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.keep or args.screenshots:
        print(f"screenshots: {shots}")
    print("audit UI check:", "passed" if not failures else f"failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
