"""Integrity: the hash chain detects edits, deletions, unchained inserts and truncation; records and approvals."""

import json
import os

import pytest

from kepsilon.audit.approvals import ApprovalMissing, approve, require_approval
from kepsilon.audit.chain import ChainBroken, verify_chain, write_checkpoint
from kepsilon.audit.ledger import mark_noise_drawn, reserve, set_cap
from kepsilon.audit.records import record_release
from kepsilon.audit.seeds import seal_seed, unseal_seed
from kepsilon.audit.store import PROTECTED_TABLES, open_store
from kepsilon.tasks.errors import SpecError

SPEC_HASH = "a" * 64
OTHER_HASH = "b" * 64


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.delenv("KEPSILON_SEED_KEY", raising=False)
    monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "seed.key"))


def _manifest(release_id="rel-1", key="key-1", **extra):
    manifest = {
        "release_id": release_id,
        "population_id": "pop",
        "idempotency_key": key,
        "spec_hash": SPEC_HASH,
        "k": 5,
        "epsilon": 1.0,
        "epsilon_split": {"age": 0.5, "hours": 0.5},
        "algorithm": "mondrian",
        "scale_basis": "diameter",
        "mechanism": "laplace",
        "roles": {"explicit": ["id"], "k_quasi": ["sex"], "e_quasi": ["age", "hours"], "sensitive": ["income"]},
        "hierarchies": {"sex": "c" * 64},
        "source": {"path": "data/people.csv", "sha256": "d" * 64, "rows": 100},
        "rows_in": 100,
        "rows_removed": {"explicit": 0, "suppression": 3},
        "rows_published": 97,
        "checks": [{"name": "k_anonymity", "success": True}, {"name": "no_identifiers", "success": True}],
        "outputs": {"release.csv": "e" * 64},
        "seed_commitment": "f" * 64,
        "software": {"kepsilon": "0.1.0", "numpy": "2.4.6"},
        "execution": {"flow_run_id": "run-1", "operator": "bob", "started_at": "t0", "finished_at": "t1"},
    }
    manifest.update(extra)
    return manifest


@pytest.fixture
def db(tmp_path):
    store = open_store(tmp_path / "audit.db")
    set_cap(store, "pop", 2.0, "alice", "initial")
    reservation = reserve(store, population_id="pop", epsilon=1.0, idempotency_key="key-1", release_id="rel-1", operator="bob")
    seal_seed(store, idempotency_key="key-1", release_id="rel-1", seed=os.urandom(32))
    mark_noise_drawn(store, reservation.id)
    record_release(store, _manifest(), outcome="published", reservation_id=reservation.id)
    approve(store, release_id="rel-1", spec_hash=SPEC_HASH, approver="carol", reason="ok")
    unseal_seed(store, release_id="rel-1", by="dave", reason="audit sample")
    yield store
    store.close()


def _drop_triggers(db):
    for table in PROTECTED_TABLES:
        db.execute(f"DROP TRIGGER {table}_no_update")
        db.execute(f"DROP TRIGGER {table}_no_delete")


def test_intact_store_verifies(db):
    ok, problems = verify_chain(db)
    assert ok and problems == []
    chained = db.execute("SELECT COUNT(*) FROM chain").fetchone()[0]
    rows = sum(db.execute(f"SELECT COUNT(*) FROM [{t}]").fetchone()[0] for t in PROTECTED_TABLES if t != "chain")
    assert chained == rows


@pytest.mark.parametrize("table", PROTECTED_TABLES)
def test_every_audit_table_refuses_update_and_delete(db, table, tmp_path):
    write_checkpoint(db, tmp_path / "head.json")
    assert db.execute(f"SELECT COUNT(*) FROM [{table}]").fetchone()[0] > 0
    with pytest.raises(Exception, match=f"{table} is append-only: UPDATE"):
        db.execute(f"UPDATE [{table}] SET rowid = rowid")
    with pytest.raises(Exception, match=f"{table} is append-only: DELETE"):
        db.execute(f"DELETE FROM [{table}]")


def test_edited_row_after_dropping_triggers_is_detected(db):
    _drop_triggers(db)
    db.execute("UPDATE ledger SET nano_epsilon = 10000000000 WHERE kind = 'cap'")
    ok, problems = verify_chain(db)
    assert not ok
    assert any("ledger#1 does not match its hash" in p for p in problems)
    assert any("trigger against UPDATE is missing" in p for p in problems)


def test_edited_row_with_recomputed_entry_hash_is_detected_by_the_next_entry(db):
    from kepsilon.audit.store import chain_hash, row_content

    _drop_triggers(db)
    db.execute("UPDATE checks SET success = 0 WHERE name = 'k_anonymity'")
    seq, row_id = db.execute("SELECT seq, row_id FROM chain WHERE table_name = 'checks' ORDER BY seq LIMIT 1").fetchone()
    previous = db.execute("SELECT entry_hash FROM chain WHERE seq = ?", [seq - 1]).fetchone()[0]
    forged = chain_hash(previous, row_content(db.conn, "checks", row_id))
    db.execute("UPDATE chain SET entry_hash = ? WHERE seq = ?", [forged, seq])
    ok, problems = verify_chain(db)
    assert not ok and any(f"chain entry {seq + 1}:" in p for p in problems)


def test_deleted_row_is_detected(db):
    _drop_triggers(db)
    db.execute("DELETE FROM approvals")
    ok, problems = verify_chain(db)
    assert not ok and any("approvals#1 is missing (deleted)" in p for p in problems)


def test_row_inserted_outside_the_chain_is_detected(db):
    db.execute(
        "INSERT INTO approvals (release_id, spec_hash, approver, reason, created_at) VALUES ('rel-1', ?, 'x', 'y', 'z')",
        [SPEC_HASH],
    )
    ok, problems = verify_chain(db)
    assert not ok and any("approvals: 1 row(s) not covered" in p for p in problems)


def test_truncated_history_is_detected_against_the_checkpoint(db, tmp_path):
    checkpoint = tmp_path / "outside" / "head.json"
    written = write_checkpoint(db, checkpoint)
    assert json.loads(checkpoint.read_text())["entry_count"] == written["entry_count"]
    assert verify_chain(db, checkpoint) == (True, [])
    # Truncate the tail consistently: the last approval, its chain entry, and the recorded checkpoint.
    _drop_triggers(db)
    db.execute("DELETE FROM checkpoints")
    db.execute("DELETE FROM chain WHERE table_name = 'checkpoints'")
    last = db.execute("SELECT seq, table_name, row_id FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    db.execute(f"DELETE FROM [{last[1]}] WHERE rowid = ?", [last[2]])
    db.execute("DELETE FROM chain WHERE seq = ?", [last[0]])
    for table in PROTECTED_TABLES:  # even with the triggers restored, the store alone looks intact
        db.execute(f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN SELECT RAISE(ABORT, 'x'); END")
        db.execute(f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} BEGIN SELECT RAISE(ABORT, 'x'); END")
    assert verify_chain(db) == (True, [])
    ok, problems = verify_chain(db, checkpoint)
    assert not ok and any("fewer than the" in p and "truncated" in p for p in problems)


def test_checkpoint_refuses_a_broken_chain(db, tmp_path):
    _drop_triggers(db)
    db.execute("UPDATE releases SET k = 2")
    with pytest.raises(ChainBroken, match="releases#1"):
        write_checkpoint(db, tmp_path / "head.json")
    assert not (tmp_path / "head.json").exists()


def test_record_release_normalises_the_manifest(db):
    release = db.execute("SELECT * FROM releases").fetchone()
    columns = [d[0] for d in db.execute("SELECT * FROM releases").description]
    row = dict(zip(columns, release))
    assert (row["k"], row["epsilon"], row["scale_basis"], row["operator"], row["source_rows"]) == (5, 1.0, "diameter", "bob", 100)
    assert db.execute("SELECT name, success FROM checks ORDER BY id").fetchall() == [("k_anonymity", 1), ("no_identifiers", 1)]
    assert db.execute("SELECT path, sha256 FROM outputs").fetchall() == [("release.csv", "e" * 64)]
    assert dict(db.execute("SELECT stage, rows_removed FROM stage_counts").fetchall()) == {"explicit": 0, "suppression": 3}
    parameters = dict(db.execute("SELECT name, value FROM parameters").fetchall())
    assert parameters["epsilon_split.age"] == 0.5 and parameters["hierarchies.sex"] == "c" * 64
    assert json.loads(parameters["roles.e_quasi"]) == ["age", "hours"]
    assert json.loads(row["manifest"])["rows_removed"] == {"explicit": 0, "suppression": 3}


def test_record_release_tolerates_partial_manifests_and_refuses_raw_seeds(db):
    refused = record_release(db, {"release_id": "rel-2", "error": "over budget"}, outcome="refused", reservation_id=None)
    assert db.execute("SELECT outcome, outcome_detail, k FROM releases WHERE id = ?", [refused]).fetchone() == ("refused", "over budget", None)
    with pytest.raises(SpecError, match="perturbation.seed"):
        record_release(db, _manifest(perturbation={"seed": "00ff"}), outcome="published", reservation_id=None)
    with pytest.raises(SpecError, match="outcome"):
        record_release(db, _manifest(), outcome="done", reservation_id=None)
    with pytest.raises(SpecError, match="reservation_id"):
        record_release(db, _manifest(), outcome="published", reservation_id=999)
    assert db.execute("SELECT COUNT(*) FROM releases").fetchone()[0] == 2
    assert verify_chain(db)[0]


def test_two_person_rule(db):
    approval = require_approval(db, release_id="rel-1", spec_hash=SPEC_HASH, operator="bob")
    assert approval["approver"] == "carol"
    approve(db, release_id="rel-2", spec_hash=SPEC_HASH, approver="Bob ", reason="self")
    with pytest.raises(ApprovalMissing, match="only by its own operator"):
        require_approval(db, release_id="rel-2", spec_hash=SPEC_HASH, operator="bob")
    with pytest.raises(ApprovalMissing, match="only for other spec hashes"):
        require_approval(db, release_id="rel-1", spec_hash=OTHER_HASH, operator="bob")
    with pytest.raises(ApprovalMissing, match="no approval is recorded"):
        require_approval(db, release_id="rel-3", spec_hash=SPEC_HASH, operator="bob")
    with pytest.raises(SpecError, match="spec_hash"):
        approve(db, release_id="rel-1", spec_hash="abc", approver="carol", reason="ok")
