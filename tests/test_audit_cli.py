"""`kepsilon audit …` answers the officers' questions on a store built by real API calls."""

import csv
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kepsilon.audit.ledger as ledger_module
from kepsilon.audit import queries
from kepsilon.audit.approvals import approve
from kepsilon.audit.cli import audit_app
from kepsilon.audit.headlog import head_log_path
from kepsilon.audit.ledger import BudgetExceeded, budget, mark_noise_drawn, reserve, set_cap, void
from kepsilon.audit.records import record_release
from kepsilon.audit.seeds import seal_seed, unseal_seed
from kepsilon.audit.store import open_store

runner = CliRunner()
S1, S2 = "1" * 64, "2" * 64
SEEDS = {key: os.urandom(32) for key in ("k1", "k2", "k3", "k4", "k7")}


def _manifest(release_id, key, *, k=5, epsilon=0.5, basis="diameter", source=S1, numpy="2.4.6", operator="bob",
              checks=(("k_anonymity", True),), rows_in=100, suppressed=2, suppression_budget=0.05):
    return {
        "release_id": release_id, "population_id": "adult", "idempotency_key": key, "spec_hash": key[-1] * 64,
        "k": k, "epsilon": epsilon, "scale_basis": basis, "mechanism": "laplace", "algorithm": "mondrian",
        "suppression_budget": suppression_budget, "source": {"path": "adult.csv", "sha256": source, "rows": rows_in},
        "rows_in": rows_in, "rows_removed": {"suppression": suppressed}, "rows_published": rows_in - suppressed,
        "checks": [{"name": n, "success": s} for n, s in checks], "outputs": {f"{release_id}.csv": "9" * 64},
        "seed_commitment": None, "software": {"kepsilon": "0.1.0", "numpy": numpy, "git_commit": "abc123"},
        "execution": {"flow_run_id": f"run-{release_id}", "operator": operator},
    }


def _release(db, release_id, key, epsilon, **manifest_args):
    """Seal, reserve, draw noise, record: the flow's order of calls."""
    seal_seed(db, idempotency_key=key, release_id=release_id, seed=SEEDS[key])
    reservation = reserve(db, population_id="adult", epsilon=epsilon, idempotency_key=key, release_id=release_id, operator="bob")
    mark_noise_drawn(db, reservation.id)
    return reservation


def build_store(path):
    """Seven simulated releases of population 'adult' (cap 1.0 raised to 2.0) covering every question."""
    db = open_store(path)
    set_cap(db, "adult", 1.0, "alice", "initial policy")
    set_cap(db, "adult", 2.0, "alice", "board decision 7")
    with pytest.MonkeyPatch.context() as patch:  # R1's noise was drawn more than 12 months ago
        patch.setattr(ledger_module, "now", lambda: "2024-01-01T00:00:00.000000Z")
        r1 = _release(db, "R1", "k1", 0.5)
    record_release(db, _manifest("R1", "k1"), outcome="published", reservation_id=r1.id)
    approve(db, release_id="R1", spec_hash="1" * 64, approver="carol", reason="reviewed")
    r2 = _release(db, "R2", "k2", 0.25)
    record_release(db, _manifest("R2", "k2", k=3, epsilon=0.25, basis="bounds", source=S2, numpy="2.4.5"),
                   outcome="published", reservation_id=r2.id)
    approve(db, release_id="R2", spec_hash="2" * 64, approver="bob", reason="self-approved")
    r3 = _release(db, "R3", "k3", 0.5)  # crashes after noise; recorded failed, then rerun
    record_release(db, {**_manifest("R3", "k3"), "error": "publish interrupted"}, outcome="failed", reservation_id=r3.id)
    rerun = reserve(db, population_id="adult", epsilon=0.5, idempotency_key="k3", release_id="R3", operator="bob")
    unseal_seed(db, idempotency_key="k3", by="kepsilon-flow", reason="rerun of interrupted release")
    mark_noise_drawn(db, rerun.id)
    record_release(db, _manifest("R3", "k3"), outcome="published", reservation_id=rerun.id)
    r4 = _release(db, "R4", "k4", 0.25)
    mark_noise_drawn(db, r4.id, redraw=True)
    record_release(db, {**_manifest("R4", "k4", epsilon=0.25, checks=(("k_anonymity", False), ("ranges", True))),
                        "failure": "release checks failed: k_anonymity", "failure_class": "ValidationFailed"},
                   outcome="failed", reservation_id=r4.id)
    r6 = reserve(db, population_id="adult", epsilon=0.25, idempotency_key="k6", release_id="R6", operator="bob")
    void(db, r6.id, "check failed before noise")
    r7 = _release(db, "R7", "k7", 0.1)
    record_release(db, _manifest("R7", "k7", epsilon=0.1, suppressed=10), outcome="published", reservation_id=r7.id)
    try:
        reserve(db, population_id="adult", epsilon=0.5, idempotency_key="k5", release_id="R5", operator="bob")
        raise AssertionError("R5 should exceed the cap")
    except BudgetExceeded as refused:
        record_release(db, {"release_id": "R5", "idempotency_key": "k5", "error": str(refused)}, outcome="refused",
                       reservation_id=None)
    return db


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    directory = tmp_path_factory.mktemp("audit")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEPSILON_SEED_KEY_FILE", str(directory / "seed.key"))
        patch.delenv("KEPSILON_SEED_KEY", raising=False)
        build_store(directory / "audit.db").close()
    return directory / "audit.db"


@pytest.fixture
def writable(store_path, tmp_path, monkeypatch):
    """A private copy of the built store for commands that write."""
    monkeypatch.chdir(tmp_path)  # `verify` reads ./out: not the checkout's, where `make demo` published from another store
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(store_path.parent / "seed.key"))
    db = open_store(store_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    shutil.copy(store_path, tmp_path / "audit.db")
    copy = head_log_path(tmp_path / "audit.db")  # a copy of a store goes with its head log
    copy.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(head_log_path(store_path), copy)
    return tmp_path / "audit.db"


def audit(path, *args):
    result = runner.invoke(audit_app, ["--db", str(path), *args])
    return result


def rows(path, *args):
    result = audit(path, *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_q1_budget_lifetime_last_12_months_and_remaining(store_path):
    # spends: R1 0.5 (2024), R2 0.25, R3 0.5, R4 0.25 + re-draw 0.25, R7 0.1; R6 voided; R5 refused.
    assert rows(store_path, "budget", "adult") == [{
        "population_id": "adult", "cap": 2.0, "spent_lifetime": 1.85, "spent_last_12_months": 1.35,
        "reserved_not_spent": 0.0, "remaining": 0.15,
        # No DP-mode release: the DP total is empty and every ε is the method's own mode's.
        "dp_epsilon": 0.0, "dp_delta": 0.0, "kepsilon_mode_epsilon": 1.85, "delta_cap": None, "delta_remaining": None,
        "cap_entries": 2,
    }]
    db = open_store(store_path)
    assert budget(db, "adult")["remaining"] == 150_000_000
    db.close()
    unknown = audit(store_path, "budget", "nobody")  # not zeros: a mistyped id is an error naming it
    assert unknown.exit_code == 2 and unknown.output.strip() == (
        "error: population 'nobody' is not in the audit store (`kepsilon audit populations` lists them)")


def test_q2_policy(store_path):
    found = rows(store_path, "policy", "--min-k", "5", "--max-epsilon", "0.4")
    assert {(r["release_id"], r["breach"]) for r in found} == {
        ("R1", "epsilon above policy"), ("R2", "k below policy"), ("R3", "epsilon above policy"),
    }
    assert len(found) == 4  # R3 has two records (failed, then published)


def test_q3_who_ran_and_approved(store_path):
    assert [(r["operator"], r["approver"], r["same_person"]) for r in rows(store_path, "who", "R1")] == [("bob", "carol", "no")]
    assert [(r["operator"], r["approver"], r["same_person"]) for r in rows(store_path, "who", "R2")] == [("bob", "bob", "yes")]
    assert [r["approver"] for r in rows(store_path, "who", "R4")] == [None]


def test_q4_provenance_and_impact(store_path):
    (r2,) = rows(store_path, "provenance", "R2")
    assert r2["source_sha256"] == S2 and "numpy=2.4.5" in r2["software"] and r2["git_commit"] == "abc123"
    assert [r["release_id"] for r in rows(store_path, "impact", "--source-sha", S2)] == ["R2"]
    assert [r["release_id"] for r in rows(store_path, "impact", "--version", "numpy=2.4.5")] == ["R2"]
    assert {r["release_id"] for r in rows(store_path, "impact", "--version", "2.4.6")} == {"R1", "R3", "R4", "R7"}
    assert audit(store_path, "impact").exit_code == 2


def test_q5_reruns_unpublished_and_voided(store_path):
    shared = rows(store_path, "reruns", "--only", "shared")
    assert [(r["idempotency_key"], r["runs"], r["outcomes"]) for r in shared] == [("k3", 2, "failed,published")]
    assert {r["idempotency_key"] for r in rows(store_path, "reruns", "--only", "unpublished")} == {"k4", "k6"}
    assert [(r["idempotency_key"], r["void_reason"]) for r in rows(store_path, "reruns", "--only", "voided")] == [
        ("k6", "check failed before noise")
    ]
    assert len(rows(store_path, "reruns")) == 6  # one reservation per key; the rerun of k3 reused its own


def test_q6_noise_drawn_more_than_once(store_path):
    (draw,) = rows(store_path, "noise-draws")
    assert (draw["idempotency_key"], draw["noise_draws"], draw["epsilon_charged"]) == ("k4", 2, 0.5)


def test_q7_failures(store_path):
    found = {(r["release_id"], r["outcome"]): r for r in rows(store_path, "failures")}
    assert set(found) == {("R3", "failed"), ("R4", "failed"), ("R5", "refused"), ("R7", "published")}
    assert found[("R4", "failed")]["failed_checks"] == "k_anonymity"
    assert "exceeds the remaining budget" in found[("R5", "refused")]["failure_reason"]
    assert found[("R7", "published")]["rows_suppressed"] == 10


def test_q7_failures_say_why_and_publish_no_rows(store_path):
    found = {(r["release_id"], r["outcome"]): r for r in rows(store_path, "failures")}
    # The manifests counted 98 rows before each stop; nothing reached readers.
    assert {r["rows_published"] for key, r in found.items() if key[1] != "published"} == {0}
    assert found[("R4", "failed")]["failure_reason"] == "ValidationFailed: release checks failed: k_anonymity"
    assert found[("R3", "failed")]["failure_reason"] == "publish interrupted"
    assert found[("R7", "published")]["rows_published"] == 90
    db = open_store(store_path)
    stored = dict(db.execute("SELECT release_id, rows_published FROM releases WHERE outcome != 'published'").fetchall())
    db.close()
    assert stored == {"R3": 0, "R4": 0, "R5": 0}


def test_q8_scale_basis(store_path):
    assert [r["release_id"] for r in rows(store_path, "scale-basis", "--basis", "bounds")] == ["R2"]
    data_derived = rows(store_path, "scale-basis", "--basis", "diameter")
    assert len(data_derived) == 5 and all(r["noise_scale"].startswith("data-derived") for r in data_derived)


def test_q9_unseals(store_path):
    assert [(r["release_id"], r["actor"], r["reason"], r["commitment_verified"]) for r in rows(store_path, "unseals")] == [
        ("R3", "kepsilon-flow", "rerun of interrupted release", "yes")
    ]


def test_q10_verify_checkpoint_and_tamper(writable, tmp_path):
    assert rows(writable, "verify")[0]["ok"] is True
    checkpoint = tmp_path / "head.json"
    result = audit(writable, "checkpoint", str(checkpoint))
    assert result.exit_code == 0 and checkpoint.exists()
    assert rows(writable, "verify", "--checkpoint", str(checkpoint))[0]["ok"] is True
    db = open_store(writable)
    db.execute("DROP TRIGGER checks_no_update")
    db.execute("UPDATE checks SET success = 1")
    db.close()
    result = audit(writable, "verify", "--checkpoint", str(checkpoint), "--format", "json")
    assert result.exit_code == 2 and "Traceback" not in result.output
    problems = [r["problem"] for r in json.loads(result.stdout)]
    assert any("does not match its hash" in p for p in problems) and any("UPDATE is missing" in p for p in problems)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: audit store") and "does not match its hash" in line


def test_set_cap_and_approve_commands_write_attributed_entries(writable):
    assert audit(writable, "set-cap", "adult", "3", "--by", "alice", "--reason", "board 8").exit_code == 0
    assert rows(writable, "budget", "adult")[0]["remaining"] == 1.15
    assert audit(writable, "approve", "R4", "--spec-hash", "4" * 64, "--by", "carol", "--reason", "ok").exit_code == 0
    assert [r["approver"] for r in rows(writable, "who", "R4")] == ["carol"]
    bad = audit(writable, "approve", "R4", "--spec-hash", "nothex", "--by", "carol", "--reason", "ok")
    assert bad.exit_code == 2 and "spec_hash" in bad.output


def test_set_cap_with_delta_caps_the_dp_total_and_a_later_epsilon_cap_keeps_it(writable):
    result = audit(writable, "set-cap", "adult", "3", "--delta", "1e-5", "--by", "alice", "--reason", "DP releases")
    assert result.exit_code == 0 and "δ=1e-05" in result.output
    db = open_store(writable)
    reserve(db, population_id="adult", epsilon=0.5, idempotency_key="dp-1", release_id="DP1", operator="bob", delta=4e-6)
    db.close()
    answer = rows(writable, "budget", "adult")[0]
    assert (answer["dp_epsilon"], answer["dp_delta"], answer["kepsilon_mode_epsilon"]) == (0.5, 4e-06, 1.85)
    assert (answer["delta_cap"], answer["delta_remaining"]) == (1e-05, 6e-06)
    again = audit(writable, "set-cap", "adult", "4", "--by", "alice", "--reason", "more ε only")
    assert again.exit_code == 0 and "δ=1e-05" in again.output
    assert rows(writable, "budget", "adult")[0]["delta_cap"] == 1e-05


def test_unseal_writes_the_seed_to_a_file_not_stdout(writable, tmp_path):
    out = tmp_path / "seed.hex"
    result = audit(writable, "unseal", "R1", "--by", "erin", "--reason", "incident 3", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_text().strip() == SEEDS["k1"].hex() and SEEDS["k1"].hex() not in result.output
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert rows(writable, "unseals", "--release", "R1")[0]["actor"] == "erin"


def test_read_commands_refuse_a_missing_store_and_set_cap_creates_one(tmp_path):
    missing = tmp_path / "nowhere.db"
    result = audit(missing, "budget", "adult")
    assert result.exit_code == 2 and "no audit store" in result.output and not missing.exists()
    assert audit(missing, "set-cap", "adult", "0.3", "--by", "alice", "--reason", "first").exit_code == 0
    assert rows(missing, "budget", "adult")[0]["remaining"] == 0.3


def test_table_and_csv_formats(store_path):
    table = audit(store_path, "who", "R1")
    assert table.exit_code == 0 and "Who ran" in table.output and "carol" in table.output
    parsed = list(csv.DictReader(io.StringIO(audit(store_path, "unseals", "--format", "csv").output)))
    assert parsed[0]["actor"] == "kepsilon-flow"


def test_datasette_metadata_is_generated_from_the_same_queries():
    from pathlib import Path

    committed = Path(__file__).resolve().parents[1] / "audit" / "datasette.yaml"
    assert committed.read_text(encoding="utf-8") == queries.datasette_yaml()


def test_policy_with_empty_fields_takes_the_cli_defaults(store_path):
    """Datasette sends empty strings for untouched fields: they mean k below 5 and ε above 1.0, as in the CLI."""
    db = open_store(store_path)
    try:
        empty = queries.run(db, "policy", min_k="", max_epsilon="")
        missing = queries.run(db, "policy")
        typed = queries.run(db, "policy", min_k=" 5 ", max_epsilon="1.0")
    finally:
        db.close()
    cli_default = rows(store_path, "policy")
    assert [(r["release_id"], r["breach"]) for r in empty] == [("R2", "k below policy")]
    assert empty == missing == typed == cli_default


def test_questions_about_one_population_or_release_refuse_an_empty_one(store_path):
    """No population, no answer: an empty field must not read as a population that spent nothing."""
    db = open_store(store_path)
    try:
        assert queries.run(db, "budget", population="") == []
        assert queries.run(db, "who", release="") == []
        assert queries.run(db, "provenance", release="") == []
        assert queries.run(db, "impact", source_sha="", version="") == []
        assert len(queries.run(db, "budget", population="adult")) == 1
    finally:
        db.close()
    empty = audit(store_path, "budget", "")
    assert empty.exit_code == 2 and "give a population id" in empty.output


def test_scale_basis_any_and_empty_mean_every_release(store_path):
    db = open_store(store_path)
    try:
        assert queries.run(db, "scale_basis", basis="any") == queries.run(db, "scale_basis", basis="")
        assert len(queries.run(db, "scale_basis", basis="any")) == 7  # every record, the refused R5 too
    finally:
        db.close()


def test_datasette_metadata_hides_the_sql_and_the_sealed_seeds():
    metadata = queries.datasette_metadata()["databases"]["audit"]
    assert set(metadata["queries"]) == set(queries.QUERIES) and len(metadata["queries"]) == 15
    assert all(query["hide_sql"] is True for query in metadata["queries"].values())
    assert metadata["tables"]["sealed_seeds"] == {"hidden": True, "allow": False}


# --- Officers' lists, unknown ids, failures with figures, tables that fit (issue 22.8) ------------------------


def test_releases_newest_first_with_status_epsilon_delta_and_records_published(store_path):
    listed = rows(store_path, "releases")
    db = open_store(store_path)
    recorded = db.execute("SELECT COUNT(*) FROM releases").fetchone()[0]
    unrecorded = db.execute("SELECT COUNT(*) FROM ledger l WHERE kind = 'reserve' AND NOT EXISTS "
                            "(SELECT 1 FROM releases r WHERE r.idempotency_key = l.idempotency_key)").fetchone()[0]
    db.close()
    assert len(listed) == recorded + unrecorded
    times = [row["at"] for row in listed]
    assert times == sorted(times, reverse=True)  # newest first
    r2 = next(row for row in listed if row["release_id"] == "R2")
    assert (r2["status"], r2["k"], r2["epsilon"], r2["records_published"]) == ("published", 3, 0.25, 98)
    assert {row["status"] for row in listed} >= {"published", "failed", "refused"}
    assert [row["release_id"] for row in rows(store_path, "releases", "--population", "adult")] == [
        row["release_id"] for row in listed if row["population_id"] == "adult"]


def test_populations_with_caps_spent_left_and_records_published(store_path):
    (adult,) = rows(store_path, "populations")
    assert (adult["population_id"], adult["epsilon_cap"], adult["epsilon_left"]) == ("adult", 2.0, 0.15)
    assert adult["epsilon_spent"] == pytest.approx(1.85) and adult["delta_cap"] is None
    db = open_store(store_path)
    published = db.execute("SELECT COUNT(*), SUM(rows_published) FROM releases "
                           "WHERE population_id = 'adult' AND outcome = 'published'").fetchone()
    db.close()
    assert (adult["published"], adult["records_published"]) == published


@pytest.mark.parametrize("arguments, named", [
    (("budget", "adlt"), "population 'adlt'"),
    (("advice", "--population", "adlt"), "population 'adlt'"),
    (("releases", "--population", "adlt"), "population 'adlt'"),
    (("who", "R99"), "release 'R99'"),
    (("provenance", "R99"), "release 'R99'"),
    (("unseals", "--release", "R99"), "release 'R99'"),
])
def test_an_unknown_id_is_an_error_naming_it_not_an_empty_answer(store_path, arguments, named):
    result = audit(store_path, *arguments)
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert named in line and "is not in the audit store" in line


def test_failures_show_each_failed_check_with_its_figure_limit_and_the_epsilon_it_spent(tmp_path):
    path = tmp_path / "audit.db"
    db = open_store(path)
    set_cap(db, "adult", 5.0, "alice", "initial")
    spent = _release(db, "F1", "k1", 0.5)
    record_release(db, {**_manifest("F1", "k1", checks=()), "checks": [
        {"name": "k_anonymity", "success": True, "figure": 5, "limit": 5},
        {"name": "linking_risk_within_limit", "success": False, "figure": 0.31, "limit": 0.2}]},
        outcome="failed", reservation_id=spent.id)
    older = reserve(db, population_id="adult", epsilon=0.25, idempotency_key="k2", release_id="F2", operator="bob")
    record_release(db, _manifest("F2", "k2", checks=(("linking_risk_within_limit", False),)), outcome="failed",
                   reservation_id=older.id)  # an older record: no figure, no limit; failed before the noise
    db.close()
    found = {row["release_id"]: row for row in rows(path, "failures")}
    assert found["F1"]["check_figures"] == "linking_risk_within_limit 0.31 (limit 0.2)"
    assert (found["F1"]["epsilon"], found["F1"]["epsilon_status"]) == (0.5, "spent")
    assert found["F2"]["check_figures"] == "linking_risk_within_limit — (limit —)"
    assert (found["F2"]["epsilon"], found["F2"]["epsilon_status"]) == (0.25, "reserved (a rerun reuses it)")


def test_impact_by_source_file_uses_the_installation_key(tmp_path, monkeypatch):
    monkeypatch.setenv("KEPSILON_FINGERPRINT_KEY", "ab" * 32)
    from kepsilon.audit.fingerprint import file_fingerprint

    source = tmp_path / "adult.csv"
    source.write_text("age,zip\n30,1000\n")
    path = tmp_path / "audit.db"
    db = open_store(path)
    set_cap(db, "adult", 5.0, "alice", "initial")
    reservation = _release(db, "R1", "k1", 0.5)
    record_release(db, _manifest("R1", "k1", source=file_fingerprint(source)), outcome="published",
                   reservation_id=reservation.id)
    db.close()
    assert [row["release_id"] for row in rows(path, "impact", "--source", str(source))] == ["R1"]
    missing = audit(path, "impact", "--source", str(tmp_path / "gone.csv"))
    assert missing.exit_code == 2 and "--source" in missing.output


def _in_tmux(command: list[str], tmp_path, columns: int = 120) -> list[str]:
    """Run ``command`` in a real terminal (a detached tmux session ``columns`` wide) and return the screen's lines."""
    import shlex
    import subprocess
    import time

    session = f"kepsilon-audit-{os.getpid()}-{time.monotonic_ns()}"
    tmp_path.mkdir(parents=True, exist_ok=True)
    done = tmp_path / "done"
    # A running tmux server gives new sessions its own environment, not ours: pass on where head logs live.
    state = os.environ.get("XDG_STATE_HOME")
    prefix = f"export XDG_STATE_HOME={shlex.quote(state)}; " if state else ""
    script = f"{prefix}{shlex.join(command)}; echo $? > {shlex.quote(str(done))}; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(columns), "-y", "80",
                    "bash", "--norc", "-c", script], check=True, env={**os.environ, "TERM": "xterm-256color"})
    try:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session, "-S", "-200"],
                                capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert done.read_text().strip() == "0", screen
    return screen.rstrip("\n").splitlines()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal")
def test_wide_answers_stay_readable_in_a_120_column_terminal(store_path, tmp_path):
    kepsilon = shutil.which("kepsilon") or str(Path(os.sys.executable).with_name("kepsilon"))
    env_free = [kepsilon, "audit", "--db", str(store_path)]
    listed = _in_tmux([*env_free, "releases"], tmp_path / "a")
    assert max(len(line) for line in listed) <= 120
    # one table, one line per release: its id, status and ε on the same line, the time whole
    r2 = [line for line in listed if "│ R2 " in line]
    assert len(r2) == 1 and "published" in r2[0] and "0.25" in r2[0]
    assert re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", r2[0])
    failures = _in_tmux([*env_free, "failures"], tmp_path / "b")
    assert max(len(line) for line in failures) <= 120
    assert "too wide for 120 columns: one record at a time (--format csv or json for a sheet)" in " ".join(failures)
    reason = [line for line in failures if "failure reason" in line and "ValidationFailed" in line]
    assert reason and "k_anonymity" in reason[0]  # whole words, not a column of letters
