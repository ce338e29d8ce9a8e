"""End-to-end check of the officers' read-only browser: Datasette + canned queries, seen by headless Chromium.

Builds a small audit store through the real API in a temporary folder (or uses ``--db``), serves it with
``datasette serve <store> --metadata audit/datasette.yaml`` on a free port, renders canned queries in
headless Chromium (``--dump-dom``) and asserts the rendered pages show the expected rows. It also checks
that Datasette refuses a write. Exit code 0 when every check passes.

    .venv/bin/python scripts/audit_ui_check.py [--chromium chromium] [--keep]
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
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]


def build_store(path: Path) -> None:
    """Two releases of population 'adult' (cap 1.0): R1 by bob approved by carol, R2 self-approved, bounds."""
    from kepsilon.audit.approvals import approve
    from kepsilon.audit.ledger import mark_noise_drawn, reserve, set_cap
    from kepsilon.audit.records import record_release
    from kepsilon.audit.seeds import seal_seed
    from kepsilon.audit.store import open_store

    db = open_store(path)
    set_cap(db, "adult", 1.0, "alice", "initial policy")
    for release, key, epsilon, basis, approver in (("R1", "k1", 0.5, "diameter", "carol"), ("R2", "k2", 0.25, "bounds", "bob")):
        seal_seed(db, idempotency_key=key, release_id=release, seed=os.urandom(32))
        reservation = reserve(db, population_id="adult", epsilon=epsilon, idempotency_key=key, release_id=release, operator="bob")
        mark_noise_drawn(db, reservation.id)
        manifest = {
            "release_id": release, "population_id": "adult", "idempotency_key": key, "spec_hash": key[-1] * 64,
            "k": 5, "epsilon": epsilon, "scale_basis": basis, "mechanism": "laplace",
            "execution": {"operator": "bob", "flow_run_id": f"run-{release}"},
        }
        record_release(db, manifest, outcome="published", reservation_id=reservation.id)
        approve(db, release_id=release, spec_hash=key[-1] * 64, approver=approver, reason="reviewed")
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


def dump_dom(chromium: str, url: str, profile: Path) -> str:
    """The DOM of ``url`` after Chromium rendered it (scripts run)."""
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def table_rows(dom: str) -> list[dict[str, str]]:
    """The rows of Datasette's results table as {column: cell text}."""
    body = dom.split('<table class="rows-and-columns">', 1)[-1].split("</table>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[-1], flags=re.S):
        cells = re.findall(r'<td class="col-([^"]+)">(.*?)</td>', row, flags=re.S)
        rows.append({column: html.unescape(re.sub(r"<[^>]+>", "", text)).strip() for column, text in cells})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kepsilon-audit-ui-"))
    os.environ["KEPSILON_SEED_KEY_FILE"] = str(work / "seed.key")
    os.environ.pop("KEPSILON_SEED_KEY", None)
    store = work / "audit.db"  # the file's stem names the database the metadata's canned queries attach to
    build_store(store)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    datasette = [
        str(Path(sys.executable).with_name("datasette")), "serve", str(store),
        "--metadata", str(METADATA), "--host", "127.0.0.1", "--port", str(port),
    ]
    server = subprocess.Popen(datasette, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    failures: list[str] = []
    try:
        wait_until_up(f"{base}/-/versions.json", server)
        # Each canned query page must render exactly these rows (only the named cells are compared).
        pages = {
            "budget": ("/audit/budget?population=adult",
                       [{"population_id": "adult", "spent_lifetime": "0.75", "remaining": "0.25", "cap_entries": "1"}]),
            "who": ("/audit/who?release=R2",
                    [{"release_id": "R2", "operator": "bob", "approver": "bob", "same_person": "yes"}]),
            "scale_basis": ("/audit/scale_basis?basis=bounds", [{"release_id": "R2", "noise_scale": "public bounds"}]),
        }
        for name, (path, expected) in pages.items():
            shown = table_rows(dump_dom(args.chromium, base + path, work / f"profile-{name}"))
            picked = [{column: row.get(column) for column in want} for row, want in zip(shown, expected)]
            ok = len(shown) == len(expected) and picked == expected
            print(f"{name:12} {path:40} {'ok' if ok else f'FAILED: shown {shown}'}")
            if not ok:
                failures.append(name)
        # Read-only: an arbitrary write through the SQL page must be refused.
        write = urllib.parse.quote("DELETE FROM ledger")
        dom = dump_dom(args.chromium, f"{base}/audit?sql={write}", work / "profile-write")
        refused = "Statement must be a SELECT" in dom
        print(f"{'write':12} {'/audit?sql=DELETE FROM ledger':40} {'refused' if refused else 'FAILED (not refused)'}")
        if not refused:
            failures.append("write")
    finally:
        server.terminate()
        server.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("audit UI check:", "passed" if not failures else f"failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
