"""A release launched from the Prefect UI acts as the deployment's service principal (issue 26, item 3).

``deployments/serve.sh`` exactly as ``make serve`` runs it (the throw-away project folder of
``tests/test_prefect_ui.py``), over an audit store set up as docs/identity.md tells a team to: keys made with
``kepsilon audit keygen``, ``kepsilon audit init --admin root``, the service principal ``svc-prefect``
registered as a steward and ``alice`` as an approver with root's key, a cap signed by root;
``KEPSILON_SERVICE_KEY`` names svc-prefect's key file, and the shell that starts make serve holds alice's
key as its own KEPSILON_SIGNING_KEY (a person's key that must not sign the deployment's runs).

1. The release deployment's "Custom run" form, submitted untouched in headless Chromium: the store's record of
   the run names svc-prefect as its operator, its one reservation is signed by svc-prefect's key, and
   ``kepsilon audit verify`` re-checks every signature. The key went to the worker only (the server's process
   environment holds neither variable).
2. The same form with its ``operator`` field set to ``alice``: the store records the run as refused, naming
   alice as not the signer svc-prefect, with no reservation, no sealed seed and no published folder.

Slow (a server, a worker, two browser sessions, one release): ``make test-heavy``.
"""

from __future__ import annotations

import sqlite3
import subprocess

import psutil
import pytest

from kepsilon.audit.signing import key_id, public_key_text

from .conftest import ROOT
from .test_prefect_ui import CHROMIUM, Served, submit_form

pytestmark = [pytest.mark.server, pytest.mark.heavy]


class ServedAsServicePrincipal(Served):
    """make serve over a signed store, with svc-prefect's key in KEPSILON_SERVICE_KEY."""

    def prepare(self) -> None:
        holders = self.private / "holders"
        holders.mkdir(mode=0o700)
        self.keys = {name: holders / name for name in ("root", "alice", "svc-prefect")}
        for path in self.keys.values():
            self.kepsilon("audit", "keygen", str(path))
        root = ["--key", str(self.keys["root"])]
        self.kepsilon("audit", "init", "--admin", "root", *root)
        for name, role, reason in (("svc-prefect", "steward", "the release deployment's worker"), ("alice", "approver", "officer")):
            self.kepsilon("audit", "principal", "add", name, "--role", role, "--public-key", f"{self.keys[name]}.pub",
                          "--reason", reason, *root)
        self.kepsilon("audit", "set-cap", "paper-synthetic-people", "10", "--reason", "UI test", *root)
        self.env["KEPSILON_SERVICE_KEY"] = str(self.keys["svc-prefect"])
        self.env["KEPSILON_SIGNING_KEY"] = str(self.keys["alice"])  # a person's own key in the shell: dropped

    def store(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.env['KEPSILON_AUDIT_DB']}?mode=ro", uri=True)

    def spent(self) -> tuple[int, int]:
        """(reservations, sealed seeds) in the store."""
        with self.store() as conn:
            return (conn.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0],
                    conn.execute("SELECT COUNT(*) FROM sealed_seeds").fetchone()[0])

    def record(self, flow_run_id: str) -> dict:
        """The store's one record of a flow run: release id, outcome, operator, reservation, why it stopped."""
        with self.store() as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(
                "SELECT release_id, outcome, operator, reservation_id, failure_reason FROM releases WHERE flow_run_id = ?",
                (flow_run_id,),
            ).fetchall()
        assert len(rows) == 1, f"{len(rows)} records of run {flow_run_id}:\n" + (self.private / "serve.log").read_text()[-3000:]
        return dict(rows[0])

    def reservations(self, release_id: str) -> list[tuple]:
        """The release's reservations: (actor, signer, key id, nano-ε)."""
        with self.store() as conn:
            return conn.execute(
                "SELECT l.actor, s.signer, s.key_id, l.nano_epsilon FROM ledger l "
                "JOIN signatures s ON s.table_name = 'ledger' AND s.row_id = l.id WHERE l.kind = 'reserve' AND l.release_id = ?",
                (release_id,),
            ).fetchall()

    def service_key_id(self) -> str:
        from kepsilon.audit.signing import load_private_key

        return key_id(public_key_text(load_private_key(self.keys["svc-prefect"], "test").public_key()))

    def verify(self) -> subprocess.CompletedProcess:
        """`kepsilon audit verify --format json` over the store, as an officer runs it."""
        return subprocess.run([str(ROOT / ".venv" / "bin" / "kepsilon"), "audit", "verify", "--format", "json"],
                              cwd=self.project, env=self.env, capture_output=True, text=True, timeout=120)

    def release_form(self) -> str:
        """The release deployment's "Custom run" page (V2)."""
        return f"{self.base}/v2/deployments/deployment/{self.deployment_id('release')}/run"

    def environments(self) -> dict[str, dict[str, str]]:
        """The process environment of make serve's Prefect server and worker (read from /proc)."""
        assert self.process is not None
        found = {}
        for child in psutil.Process(self.process.pid).children(recursive=True):
            line = " ".join(child.cmdline())
            for role, marker in (("server", "server start"), ("worker", "worker start")):
                if marker in line and role not in found:
                    found[role] = child.environ()
        return found


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = ServedAsServicePrincipal(tmp_path_factory.mktemp("serve-as-service"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.skipif(not CHROMIUM, reason="needs Debian's chromium")
def test_an_untouched_ui_run_is_signed_by_the_service_principal_whose_key_only_the_worker_holds(served):
    log = (served.private / "serve.log").read_text()
    assert "act as the service principal 'svc-prefect'" in log  # make serve's start-up check said so
    processes = served.environments()
    assert set(processes) == {"server", "worker"}
    assert processes["worker"].get("KEPSILON_SIGNING_KEY") == str(served.keys["svc-prefect"])
    assert "KEPSILON_SERVICE_KEY" not in processes["worker"]
    for variable in ("KEPSILON_SIGNING_KEY", "KEPSILON_SERVICE_KEY"):
        assert variable not in processes["server"]

    before = served.spent()
    run_id = submit_form(served.release_form(), [], served.login)
    served.wait_final(run_id)
    record = served.record(run_id)
    assert (record["outcome"], record["operator"]) == ("published", "svc-prefect"), record
    # ε = 1 reserved once, by the service principal, signed with its key
    assert served.reservations(record["release_id"]) == [("svc-prefect", "svc-prefect", served.service_key_id(), 10**9)]
    assert served.spent() == (before[0] + 1, before[1] + 1)
    assert (served.project / "out" / record["release_id"] / "manifest.json").exists()
    verify = served.verify()
    assert verify.returncode == 0 and "signature(s) verified" in verify.stdout, verify.stdout + verify.stderr


@pytest.mark.skipif(not CHROMIUM, reason="needs Debian's chromium")
def test_an_operator_spoofed_through_the_run_form_is_refused_before_epsilon_and_recorded_as_such(served):
    before = served.spent()
    run_id = submit_form(served.release_form(), [("Operator", 0, "alice")], served.login)
    served.wait_final(run_id)
    record = served.record(run_id)
    assert (record["outcome"], record["operator"], record["reservation_id"]) == ("refused", None, None), record
    assert "'alice' is not the release's signer 'svc-prefect'" in record["failure_reason"], record["failure_reason"]
    assert served.spent() == before  # nothing reserved, no seed sealed
    assert not (served.project / "out" / record["release_id"]).exists()

