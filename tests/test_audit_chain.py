"""Integrity: the hash chain detects edits, deletions, unchained inserts and truncation; records and approvals."""

import json
import os

import pytest

from kepsilon.audit.advice import record_advice
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
    record_advice(
        store, population_id="pop", spec_hash=SPEC_HASH, source_sha256="d" * 64, source_rows=100, actor="erin",
        via="cli", k_values=[2, 5], epsilon_values=[0.5, 1.0], draws=10,
    )
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
    signed = None
    if table in ("principals", "signatures"):  # rows there once the store has an admin, who signs the checkpoint
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from kepsilon.audit.chain import chain_head
        from kepsilon.audit.principals import init_admin, make_act

        admin = Ed25519PrivateKey.generate()
        init_admin(db, admin, "root")
        count, head = chain_head(db)
        signed = make_act(db.conn, admin, "checkpoint", {"entry_count": count, "head_hash": head})
    write_checkpoint(db, tmp_path / "head.json", signed=signed)
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


def test_failed_and_refused_releases_record_no_rows_published_and_their_reason(db):
    failed = record_release(
        db,
        _manifest(
            "rel-9",
            checks=[{"name": "k_anonymity", "success": False}, {"name": "no_identifiers", "success": True}],
            failure="release checks failed: k_anonymity",
            failure_class="ValidationFailed",
        ),
        outcome="failed",
        reservation_id=None,
    )
    disk = record_release(
        db, _manifest("rel-10", failure="[Errno 28] No space left on device", failure_class="OSError"),
        outcome="failed", reservation_id=None,
    )
    refused = record_release(db, {"release_id": "rel-11", "refusal": "approval missing"}, outcome="refused", reservation_id=None)
    published = db.execute("SELECT id FROM releases WHERE release_id = 'rel-1'").fetchone()[0]
    got = {r: db.execute("SELECT rows_published, failure_reason FROM releases WHERE id = ?", [r]).fetchone()
           for r in (failed, disk, refused, published)}
    assert got[failed] == (0, "ValidationFailed: release checks failed: k_anonymity")
    assert got[disk] == (0, "OSError: [Errno 28] No space left on device")
    assert got[refused] == (0, "approval missing")
    assert got[published] == (97, None)
    # The manifest as the flow built it is kept verbatim; only the queryable columns say what happened.
    assert json.loads(db.execute("SELECT manifest FROM releases WHERE id = ?", [failed]).fetchone()[0])["rows_published"] == 97
    assert verify_chain(db) == (True, [])


def test_failure_reason_is_one_line_and_names_unlisted_failed_checks():
    from kepsilon.audit.records import failure_reason

    checks = [{"name": "groups_of_k", "success": False}, {"name": "finite", "success": False}]
    assert failure_reason({"failure": "stopped\n  at\tpublish", "checks": checks}, "failed") == (
        "stopped at publish; failed checks: groups_of_k, finite"
    )
    assert failure_reason({"checks": checks}, "failed") == "failed checks: groups_of_k, finite"
    assert failure_reason({"failure": "x"}, "published") is None
    assert len(failure_reason({"failure": "y" * 5000}, "failed")) == 1000


def _old_cap(db, cap: float) -> None:
    """A cap entry of population 'pop' as the ledger wrote it before δ (migration 0005)."""
    from kepsilon.audit.store import append, ensure_population, write_transaction

    with write_transaction(db) as conn:
        ensure_population(conn, "pop", "alice")
        append(conn, "ledger", {"population_id": "pop", "kind": "cap", "nano_epsilon": int(cap * 1e9),
                                "actor": "alice", "reason": "initial", "created_at": "t0"})


def _old_reservation(db, epsilon: float, key: str, release_id: str) -> int:
    """A reservation entry as the ledger wrote it before δ (migration 0005); returns its id."""
    from kepsilon.audit.store import append, write_transaction

    with write_transaction(db) as conn:
        return append(conn, "ledger", {"population_id": "pop", "kind": "reserve", "nano_epsilon": int(epsilon * 1e9),
                                       "idempotency_key": key, "release_id": release_id, "actor": "bob",
                                       "created_at": "t1"})


def test_a_store_from_before_delta_migrates_and_its_chain_covers_delta(tmp_path):
    import sqlite3

    import sqlite_utils

    from kepsilon.audit.ledger import budget
    from kepsilon.audit.store import migrations

    path = tmp_path / "old.db"
    old = sqlite_utils.Database(sqlite3.connect(str(path)))
    old.enable_wal()
    migrations.apply(old, stop_before="0005_ledger_delta")
    assert "atto_delta" not in old["ledger"].columns_dict
    _old_cap(old, 2.0)
    _old_reservation(old, 0.5, "key-old", "rel-old")
    old.close()

    db = open_store(path)
    assert "atto_delta" in db["ledger"].columns_dict
    assert verify_chain(db) == (True, [])  # rows chained before the migration keep their hash
    set_cap(db, "pop", 2.0, "alice", "δ cap added", delta=1e-5)
    dp = reserve(db, population_id="pop", epsilon=0.5, idempotency_key="key-dp", release_id="rel-dp", operator="bob",
                 delta=4e-6)
    mark_noise_drawn(db, dp.id)
    assert verify_chain(db) == (True, [])
    state = budget(db, "pop")
    # The old reservation is the method's own mode: counted against the ε cap, never in the DP total.
    assert (state["in_use"], state["dp_epsilon"], state["kepsilon_epsilon"]) == (10**9, 5 * 10**8, 5 * 10**8)
    assert (state["dp_delta"], state["delta_cap"]) == (4 * 10**12, 10**13)
    # Once set, δ is covered by the chain like any other column: lowering it is caught.
    _drop_triggers(db)
    db.execute("UPDATE ledger SET atto_delta = 1 WHERE id = ?", (dp.id,))
    ok, problems = verify_chain(db)
    assert not ok and any(f"ledger#{dp.id} does not match its hash" in p for p in problems)
    db.close()


def test_a_store_from_before_failure_reason_migrates_and_its_chain_still_verifies(tmp_path):
    import sqlite3

    import sqlite_utils

    from kepsilon.audit import queries
    from kepsilon.audit.store import append, migrations, write_transaction

    path = tmp_path / "old.db"
    old = sqlite_utils.Database(sqlite3.connect(str(path)))
    old.enable_wal()
    migrations.apply(old, stop_before="0002_release_failure_reason")
    assert "failure_reason" not in old["releases"].columns_dict
    _old_cap(old, 2.0)
    reservation_id = _old_reservation(old, 1.0, "key-1", "rel-1")
    manifest = {**_manifest(), "failure": "release checks failed: k_anonymity"}
    with write_transaction(old) as conn:  # a failed record as the code before this migration wrote it
        append(conn, "releases", {"release_id": "rel-1", "outcome": "failed", "reservation_id": reservation_id,
                                  "rows_published": 97, "manifest": json.dumps(manifest), "recorded_at": "t"})
    old.close()

    db = open_store(path)
    assert "failure_reason" in db["releases"].columns_dict
    assert verify_chain(db) == (True, [])
    record_release(db, _manifest("rel-2", failure="boom", failure_class="OSError"), outcome="failed", reservation_id=None)
    assert verify_chain(db) == (True, [])
    reasons = {r["release_id"]: r["failure_reason"] for r in queries.run(db, "failures")}
    assert reasons == {"rel-1": "release checks failed: k_anonymity", "rel-2": "OSError: boom"}
    # Once set, the new column is covered by the chain like any other.
    _drop_triggers(db)
    db.execute("UPDATE releases SET failure_reason = 'nothing to see' WHERE release_id = 'rel-2'")
    ok, problems = verify_chain(db)
    assert not ok and any("releases#2 does not match its hash" in p for p in problems)
    db.close()


def test_a_store_from_before_advice_events_migrates_verifies_and_chains_advice(tmp_path):
    import sqlite3

    import sqlite_utils

    from kepsilon.audit.store import migrations

    path = tmp_path / "old.db"
    old = sqlite_utils.Database(sqlite3.connect(str(path)))
    old.enable_wal()
    migrations.apply(old, stop_before="0003_advice_events")
    assert "advice_events" not in old.table_names()
    _old_cap(old, 2.0)
    old.close()

    db = open_store(path)
    assert verify_chain(db) == (True, [])
    event = record_advice(
        db, population_id="pop", spec_hash=SPEC_HASH, source_sha256="d" * 64, source_rows=100, actor="erin",
        via="flow", flow_run_id="run-9", k_values=[10], epsilon_values=[1.0], draws=5, report_dir="reports/private/x",
    )
    assert verify_chain(db) == (True, [])
    assert db.execute("SELECT table_name, row_id FROM chain ORDER BY seq DESC LIMIT 1").fetchone() == ("advice_events", event)
    with pytest.raises(Exception, match="advice_events is append-only: UPDATE"):
        db.execute("UPDATE advice_events SET actor = 'mallory'")
    _drop_triggers(db)
    db.execute("UPDATE advice_events SET actor = 'mallory'")
    ok, problems = verify_chain(db)
    assert not ok and any(f"advice_events#{event} does not match its hash" in p for p in problems)
    db.close()


@pytest.mark.parametrize("seed", range(5))
def test_fast_row_content_is_byte_identical_to_canonical_json(seed):
    import random

    from kepsilon.audit.store import RowEncoder, canonical_json

    rng = random.Random(seed)
    texts = ["", "plain", 'quo"te\\back', "tab\tnew\nline\r", "\x00\x01\x1f\x7f", "é ü 漢字 🙂", "\u2028\u2029", "%s %d %%"]
    values = texts + [0, -1, 2**63 - 1, -(2**63), 0.1, 1.0, -0.0, 1e-300, 1e300, 3.141592653589793,
                      float("inf"), float("-inf"), None, b"", b"\x00\xffabc", True]
    columns = ["zeta", "alpha", "%weird col", "Beta", "ä", "_1", "id"]
    encoder = RowEncoder("some_table", columns)
    for _ in range(300):
        row = tuple(rng.choice(values) for _ in columns)
        assert encoder.content(row) == canonical_json({"table": "some_table", "row": dict(zip(columns, row))})
    nan = RowEncoder("t", ["x"]).content((float("nan"),))
    assert nan == canonical_json({"table": "t", "row": {"x": float("nan")}})


@pytest.mark.parametrize("seed", range(3))
def test_fast_row_content_with_later_columns_matches_the_general_rule(seed):
    """A table with later columns: left out while NULL, covered once set, mixed rows included."""
    import random

    from kepsilon.audit.store import LATER_COLUMNS, RowEncoder, canonical_json

    rng = random.Random(seed)
    columns = ["id", "population_id", "nano_epsilon", "atto_delta", "reason"]
    assert LATER_COLUMNS["ledger"] == {"atto_delta"}
    encoder = RowEncoder("ledger", columns)
    for _ in range(200):
        row = (rng.randrange(100), "pop", rng.randrange(10**9), rng.choice([None, 1, 10**18 - 1]), rng.choice([None, "x"]))
        expected = {c: v for c, v in zip(columns, row) if not (c == "atto_delta" and v is None)}
        assert encoder.content(row) == canonical_json({"table": "ledger", "row": expected})
    mixed = RowEncoder("releases", ["id", "failure_reason", "delta"])
    for row in [(1, None, None), (2, "boom", None), (3, None, 1e-6), (4, "boom", 1e-6)]:
        expected = {c: v for c, v in zip(["id", "failure_reason", "delta"], row) if c == "id" or v is not None}
        assert mixed.content(row) == canonical_json({"table": "releases", "row": expected})
