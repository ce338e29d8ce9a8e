"""Issue 24 item 1: a store put back from a backup is caught by what it cannot put back — the published manifests.

The issue's scenario through real releases: ``set-cap P 2; release 1; copy store + head log; release 2; put the
copies back``. Before this change the third release was published under a cap of 2.
"""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from kepsilon.audit.errors import StoreCompromised
from kepsilon.audit.headlog import head_log_path
from kepsilon.audit.integrity import inspect_store
from kepsilon.audit.ledger import set_cap
from kepsilon.audit.store import open_store
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec
from kepsilon.record import ReleaseRecord

from .conftest import capped_store

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

POPULATION = "test-population"


def _release(spec_dict: dict, release_id: str) -> ReleaseRecord:
    # The same source under several ids on purpose: each is a new release, not "unchanged since the last one".
    return governed_release(parse_spec({**spec_dict, "release_id": release_id, "epsilon": 1.0, "rerelease_unchanged": True}))


def _checkpointed(store: Path) -> None:
    """Fold the -wal into the file, as a backup tool copying a quiet store would see it."""
    db = open_store(store)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def _put_back(store: Path, backup: Path) -> None:
    """The backup put back as a restore tool does it: copied beside the store, then renamed over it (a new file).

    Copied over the store in place (the same inode), a connection this process still had open on the store shared
    SQLite's in-process state of that inode with the next one, whose stale WAL index then read past the restored
    file (SQLITE_IOERR_SHORT_READ, once in a make test run)."""
    for suffix in ("-wal", "-shm"):
        Path(str(store) + suffix).unlink(missing_ok=True)
    restoring = store.with_name(store.name + ".restoring")
    shutil.copy(backup, restoring)
    os.replace(restoring, store)


def _backup(store: Path, backup: Path) -> None:
    """An operator's backup, taken as SQLite takes one (the backup API): a consistent copy whatever the WAL holds.
    A plain copy of the main file while the WAL still held pages put back a torn store (SQLITE_IOERR_SHORT_READ)."""
    source, target = sqlite3.connect(store), sqlite3.connect(backup)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


def _ledger_rows(store: Path) -> int:
    conn = sqlite3.connect(store)
    try:
        return conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def rolled_back(tmp_path, monkeypatch, synthetic_spec_dict):
    """Releases 1 and 2 under a cap of 2, then the store as it was after release 1 put back (its head log
    copied and put back too): returns the store's path and the spec."""
    db = capped_store(tmp_path, monkeypatch, POPULATION)
    set_cap(db, POPULATION, 2.0, by="test-officer", reason="the issue's cap")
    db.close()
    store = tmp_path / "audit.db"
    _release(synthetic_spec_dict, "r1")
    _checkpointed(store)
    backup, log_backup = tmp_path / "backup.db", tmp_path / "backup.heads"
    _backup(store, backup)
    shutil.copy(head_log_path(store), log_backup)
    _release(synthetic_spec_dict, "r2")
    _put_back(store, backup)
    shutil.copy(log_backup, head_log_path(store))
    return store, synthetic_spec_dict


def test_the_public_manifest_witnesses_the_chain_head_at_publication(tmp_path, monkeypatch, synthetic_spec_dict):
    capped_store(tmp_path, monkeypatch, POPULATION).close()
    record = _release(synthetic_spec_dict, "r1")
    published = json.loads((Path(synthetic_spec_dict["output_dir"]) / "r1" / "manifest.json").read_text())
    witness = published["audit_chain"]
    conn = sqlite3.connect(tmp_path / "audit.db")
    stored = conn.execute("SELECT entry_hash FROM chain WHERE seq = ?", (witness["entries"],)).fetchone()[0]
    total = conn.execute("SELECT COUNT(*) FROM chain").fetchone()[0]
    sealed = conn.execute("SELECT chain.seq FROM chain JOIN sealed_seeds ON chain.table_name = 'sealed_seeds' "
                          "AND chain.row_id = sealed_seeds.id WHERE sealed_seeds.release_id = 'r1'").fetchone()[0]
    # The entry that sealed the release's seed (after its reservation, before the published record): in the chain.
    assert stored == witness["head_hash"] and witness["entries"] == sealed and 0 < sealed < total
    conn.close()
    assert set(witness) == {"entries", "head_hash"} and record["public_manifest"]["audit_chain"] == witness


def test_a_store_rolled_back_with_its_head_log_is_refused_before_epsilon(rolled_back):
    store, spec_dict = rolled_back
    ledger_before = _ledger_rows(store)
    assert inspect_store(store).ok  # store and head log agree with each other: alone, they hide the rollback
    with pytest.raises(StoreCompromised, match=r"rolled back: the store has \d+ chain entries, but the published manifest .*r2") \
            as refused:
        _release(spec_dict, "r3")
    assert "publications out of the output folder" not in str(refused.value)  # a store with entries: no such way out
    assert _ledger_rows(store) == ledger_before  # nothing reserved, nothing recorded
    assert not (Path(spec_dict["output_dir"]) / "r3").exists()
    inspection = inspect_store(store, manifests_in=[Path(spec_dict["output_dir"])])
    assert not inspection.ok and "behind the publications" in inspection.publications


def test_a_rolled_back_store_written_to_since_is_refused_as_rewritten(rolled_back):
    store, spec_dict = rolled_back
    db = open_store(store)
    for cap in (2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0):  # the chain grows past release 2's witness
        set_cap(db, POPULATION, cap, by="test-officer", reason="padding")
    db.close()
    with pytest.raises(StoreCompromised, match=r"rewritten: chain entry \d+ differs from the head the published manifest"):
        _release(spec_dict, "r3")


def test_a_deleted_head_log_is_an_error_naming_the_setting(tmp_path, monkeypatch, synthetic_spec_dict):
    capped_store(tmp_path, monkeypatch, POPULATION).close()
    _release(synthetic_spec_dict, "r1")
    store = tmp_path / "audit.db"
    ledger_before = _ledger_rows(store)
    head_log_path(store).unlink()
    with pytest.raises(StoreCompromised, match="head log .* is missing or empty.*KEPSILON_AUDIT_HEAD_LOG"):
        _release(synthetic_spec_dict, "r2")
    assert _ledger_rows(store) == ledger_before


def test_the_head_log_lives_outside_the_store_folder_and_a_fresh_store_starts_without_error(tmp_path, monkeypatch):
    db = capped_store(tmp_path, monkeypatch, POPULATION)  # a fresh store: its first commit creates the log
    db.close()
    log = head_log_path(tmp_path / "audit.db")
    assert log.exists() and tmp_path not in log.parents  # a backup of the store's folder does not hold it
    assert oct(log.stat().st_mode & 0o777) == "0o600" and oct(log.parent.stat().st_mode & 0o777) == "0o700"
    assert inspect_store(tmp_path / "audit.db").ok
