"""The store check before any ε is spent, the chain-head log, and store errors as one clear line.

Stores are built with the real ledger, seed and record calls; tampering is done as an operator with
file access would: dropping a trigger, editing or deleting a row, flipping bytes, truncating, deleting
the -wal file after a crash, putting an older copy back.
"""

import json
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlite_utils
from typer.testing import CliRunner

import kepsilon.audit.store as store_module
from kepsilon.audit.chain import verify_chain
from kepsilon.audit.cli import audit_app
from kepsilon.audit.errors import StoreCompromised, StoreUnavailable
from kepsilon.audit.headlog import ENV_HEAD_LOG, default_head_log, head_log_path, read_heads
from kepsilon.audit.integrity import check_store, inspect_store
from kepsilon.audit.ledger import BudgetExceeded, budget, mark_noise_drawn, reserve, set_cap
from kepsilon.audit.records import record_release
from kepsilon.audit.seeds import seal_seed
from kepsilon.audit.store import PROTECTED_TABLES, open_store
from kepsilon.tasks.errors import KepsilonError

MARKER = "key-MARKER-1"  # the first release's idempotency key: in ledger, releases and sealed_seeds, and their indexes


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.delenv("KEPSILON_SEED_KEY", raising=False)
    monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
    monkeypatch.delenv("KEPSILON_AUDIT_DB", raising=False)
    monkeypatch.delenv(ENV_HEAD_LOG, raising=False)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "seed.key"))


def _release(db, number: int, epsilon: float = 1.0):
    key = MARKER if number == 1 else f"key-{number}"
    seal_seed(db, idempotency_key=key, release_id=f"rel-{number}", seed=os.urandom(32))
    reservation = reserve(db, population_id="pop", epsilon=epsilon, idempotency_key=key, release_id=f"rel-{number}", operator="op")
    mark_noise_drawn(db, reservation.id)
    manifest = {"release_id": f"rel-{number}", "population_id": "pop", "idempotency_key": key, "epsilon": epsilon,
                "rows_in": 100, "rows_published": 97, "checks": [{"name": "k_anonymity", "success": True}]}
    record_release(db, manifest, outcome="published", reservation_id=reservation.id)
    return reservation


def _build(path: Path) -> Path:
    """The issue's set-up: cap 2.0, two releases of ε 1 spend it. Closed, -wal folded into the file."""
    db = open_store(path)
    set_cap(db, "pop", 2.0, "alice", "initial")
    _release(db, 1)
    _release(db, 2)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path


@pytest.fixture
def built(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # `verify` reads ./out: not the checkout's, where `make demo` published from another store
    return _build(tmp_path / "audit.db")


def _tamper(path: Path, *statements: str) -> None:
    """Run SQL with the append-only triggers dropped, then put them back, as someone covering their tracks would."""
    conn = sqlite3.connect(path)
    saved = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for table in PROTECTED_TABLES:
        conn.execute(f"DROP TRIGGER {table}_no_update")
        conn.execute(f"DROP TRIGGER {table}_no_delete")
    for statement in statements:
        conn.execute(statement)
    for (sql,) in saved:
        conn.execute(sql)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _refused(path_or_db) -> str:
    with pytest.raises(StoreCompromised) as refused:
        check_store(path_or_db)
    message = str(refused.value)
    assert "\n" not in message and "kepsilon audit verify" in message
    return message


# --- 1. The check before ε is reserved ------------------------------------------------------------


def test_an_intact_store_passes_by_path_and_by_connection(built):
    assert check_store(built) is None
    db = open_store(built)
    assert check_store(db) is None
    inspection = inspect_store(db)
    assert inspection.ok and inspection.entries == db.execute("SELECT COUNT(*) FROM chain").fetchone()[0]
    db.close()


def test_a_store_not_created_yet_passes_and_is_not_created(tmp_path):
    check_store(tmp_path / "new.db")
    assert not (tmp_path / "new.db").exists()


def test_the_issue_scenario_ledger_edited_then_a_release_over_the_cap_is_refused(built):
    db = open_store(built)
    with pytest.raises(BudgetExceeded):  # the cap is spent
        reserve(db, population_id="pop", epsilon=1.0, idempotency_key="key-3", release_id="rel-3", operator="op")
    db.close()
    # Set the first release's ε to 0 directly in SQLite (trigger dropped, UPDATE, trigger recreated).
    _tamper(built, f"UPDATE ledger SET nano_epsilon = 0 WHERE idempotency_key = '{MARKER}' OR "
                   f"reservation_id = (SELECT id FROM ledger WHERE idempotency_key = '{MARKER}')")
    db = open_store(built)
    assert budget(db, "pop")["remaining"] == 10**9  # the falsified ledger would admit a third ε 1
    message = _refused(db)
    assert "ledger#" in message and "does not match its hash" in message
    db.close()


def test_a_deleted_reserve_row_is_refused(built):
    _tamper(built, f"DELETE FROM ledger WHERE idempotency_key = '{MARKER}'")
    message = _refused(built)
    assert "ledger#" in message and "missing (deleted)" in message


def test_a_row_and_its_chain_entry_deleted_together_is_refused(built):
    _tamper(built, f"DELETE FROM chain WHERE table_name = 'ledger' AND row_id = "
                   f"(SELECT id FROM ledger WHERE idempotency_key = '{MARKER}')",
            f"DELETE FROM ledger WHERE idempotency_key = '{MARKER}'")
    _refused(built)
    assert any("before it are missing" in p for p in inspect_store(built).problems)


def test_a_ledger_row_inserted_outside_the_chain_is_refused(built):
    conn = sqlite3.connect(built)
    conn.execute("INSERT INTO ledger (population_id, kind, nano_epsilon, actor, created_at) VALUES ('pop', 'cap', 9000000000, 'x', 't')")
    conn.commit()
    conn.close()
    assert "table ledger: 1 row(s) not covered" in _refused(built)


def _occurrences(data: bytes, needle: bytes) -> list[int]:
    found, start = [], 0
    while (at := data.find(needle, start)) >= 0:
        found.append(at)
        start = at + 1
    return found


def test_every_copy_of_a_flipped_ledger_value_is_refused_in_tables_and_indexes(built, tmp_path):
    data = built.read_bytes()
    places = _occurrences(data, MARKER.encode())
    assert len(places) >= 4  # ledger, releases and sealed_seeds rows, and the indexes on those keys
    for number, place in enumerate(places):
        copy = tmp_path / f"flip-{number}.db"
        flipped = bytearray(data)
        flipped[place + 4] ^= 0x01  # 'M' -> 'L': still valid text, another key
        copy.write_bytes(bytes(flipped))
        message = _refused(copy)
        assert MARKER not in message and "LARKER" not in message


def test_a_flip_into_invalid_utf8_is_refused_without_quoting_the_text(built, tmp_path):
    data = bytearray(built.read_bytes())
    place = _occurrences(bytes(data), MARKER.encode())[0]
    data[place + 4] = 0xFF
    copy = tmp_path / "bad-utf8.db"
    copy.write_bytes(bytes(data))
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8"):  # what used to surface
        conn = sqlite3.connect(copy)
        try:
            conn.execute("SELECT * FROM ledger").fetchall()
            conn.execute("SELECT * FROM releases").fetchall()
            conn.execute("SELECT * FROM sealed_seeds").fetchall()
        finally:
            conn.close()
    message = _refused(copy)
    assert "ARKER" not in message
    problems = inspect_store(copy).problems
    assert any("ledger#" in p and "does not match its hash" in p for p in problems)
    assert any("not valid UTF-8" in p for p in problems) and not any("ARKER" in p for p in problems)


def test_random_byte_flips_are_refused_or_change_nothing_audited(built, tmp_path):
    """Whatever byte is flipped, either the check refuses the store or every audited row reads back as before."""
    def dump(path):
        conn = sqlite3.connect(path)
        try:
            return [conn.execute(f"SELECT rowid, * FROM [{t}] ORDER BY rowid").fetchall() for t in PROTECTED_TABLES]
        finally:
            conn.close()

    original, data = dump(built), built.read_bytes()
    rng = random.Random(16)
    refused = 0
    for number in range(120):
        place = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[place] ^= 1 << rng.randrange(8)
        copy = tmp_path / f"random-{number}.db"
        copy.write_bytes(bytes(flipped))
        try:
            check_store(copy)
        except StoreCompromised as error:
            assert "\n" not in str(error)
            refused += 1
        else:
            try:
                assert dump(copy) == original, f"byte {place} changed audited rows unnoticed"
            except sqlite3.DatabaseError:
                pytest.fail(f"byte {place}: the check passed a store that cannot be read")
        copy.unlink()
    assert refused > 0


def test_a_truncated_file_is_refused(built, tmp_path):
    data = built.read_bytes()
    for keep in (len(data) // 2, len(data) - 4096, 4096 + 100):
        copy = tmp_path / f"truncated-{keep}.db"
        copy.write_bytes(data[:keep])
        _refused(copy)


def test_a_file_that_is_not_a_database_or_not_an_audit_store_is_refused(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("these are not the audit records\n" * 200)
    assert "not a database" in _refused(text)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    assert "not a kepsilon audit store" in _refused(other)


def test_a_trigger_replaced_by_one_that_does_not_refuse_is_refused(built):
    conn = sqlite3.connect(built)
    conn.execute("DROP TRIGGER ledger_no_update")
    conn.execute("CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger BEGIN SELECT 1; END")
    conn.commit()
    conn.close()
    assert "no longer refuses" in _refused(built)


# --- 2. The chain-head log --------------------------------------------------------------------


def test_every_commit_that_extends_the_chain_logs_its_head(tmp_path):
    db = open_store(tmp_path / "audit.db")
    log = head_log_path(tmp_path / "audit.db")
    assert not log.exists()  # creating the schema extends no chain
    set_cap(db, "pop", 2.0, "alice", "initial")
    _release(db, 1)
    heads, unreadable = read_heads(log)
    count, head = db.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    assert unreadable == 0 and (heads[-1].entries, heads[-1].head_hash) == (count, head)
    assert [h.entries for h in heads] == sorted(h.entries for h in heads) and len(heads) == 5  # one per commit
    assert log.read_bytes().endswith(b"\n")
    db.close()


def test_the_head_log_path_comes_from_the_environment(tmp_path, monkeypatch):
    elsewhere = tmp_path / "other-disk" / "kepsilon.heads"
    monkeypatch.setenv(ENV_HEAD_LOG, str(elsewhere))
    db = open_store(tmp_path / "audit.db")
    set_cap(db, "pop", 1.0, "alice", "initial")
    db.close()
    assert read_heads(elsewhere)[0][-1].entries == 2 and not default_head_log(tmp_path / "audit.db").exists()


def test_an_older_copy_put_back_is_a_rollback(built, tmp_path):
    backup = tmp_path / "backup.db"
    shutil.copy(built, backup)
    db = open_store(built)
    set_cap(db, "pop", 3.0, "alice", "raised")
    _release(db, 3)
    db.close()
    check_store(built)
    for suffix in ("-wal", "-shm"):
        Path(str(built) + suffix).unlink(missing_ok=True)
    shutil.copy(backup, built)
    message = _refused(built)
    assert "rolled back" in message and "retire-head-log" not in message
    # The copy under another name has no head log of its own: once a store has entries, that is refused too.
    assert "is missing or empty" in _refused(backup) and "KEPSILON_AUDIT_HEAD_LOG" in _refused(backup)


def test_a_wal_deleted_after_a_crash_is_a_rollback(built):
    code = f"""
import os
from kepsilon.audit.ledger import mark_noise_drawn, reserve, set_cap
from kepsilon.audit.store import open_store
db = open_store({str(built)!r})
set_cap(db, "pop", 3.0, "alice", "raised")
spent = reserve(db, population_id="pop", epsilon=1.0, idempotency_key="late", release_id="late", operator="op")
mark_noise_drawn(db, spent.id)
os._exit(0)  # like a crash: no checkpoint at close, the three commits live only in the -wal
"""
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
    wal = Path(str(built) + "-wal")
    assert wal.stat().st_size > 0  # (checking now would fold the -wal into the file when it closes)
    wal.unlink()
    Path(str(built) + "-shm").unlink(missing_ok=True)
    db = open_store(built)
    assert budget(db, "pop")["spent"] == 2 * 10**9  # the late spend silently vanished …
    message = _refused(db)  # … but not unnoticed
    db.close()
    assert "rolled back" in message and "head log recorded" in message
    assert "retire-head-log" not in message  # a store with entries, fewer than logged: a real rollback


def test_a_chain_longer_than_the_log_is_the_crash_window_and_passes(built):
    log = head_log_path(built)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-2]))  # the last commits' lines never made it
    check_store(built)


def test_a_torn_last_line_is_skipped_and_the_next_head_starts_a_new_line(built):
    log = head_log_path(built)
    with open(log, "ab") as handle:
        handle.write(b'{"entries": 99999, "head_ha')  # a crash mid-write
    check_store(built)
    db = open_store(built)
    set_cap(db, "pop", 3.0, "alice", "raised")
    db.close()
    heads, unreadable = read_heads(log)
    assert unreadable == 1 and heads[-1].entries == inspect_store(built).entries
    check_store(built)


def test_a_log_whose_head_differs_at_its_length_is_a_rewrite(built):
    log = head_log_path(built)
    entries = read_heads(log)[0][-1].entries
    with open(log, "a") as handle:
        handle.write(f'{{"entries": {entries}, "head_hash": "{"ab" * 32}", "at": "t"}}\n')
    assert "rewritten" in _refused(built)


RETIRE = "kepsilon audit retire-head-log --by NAME --reason TEXT"


def test_a_store_deleted_while_its_log_remains_is_a_rollback_and_the_refusal_names_the_way_out(built):
    built.unlink()
    message = _refused(built)
    assert "rolled back: the store has no chain" in message and RETIRE in message


def _retire(store: Path, *args: str):
    return runner.invoke(audit_app, ["--db", str(store), "retire-head-log", *args])


def test_a_store_whose_chain_was_emptied_is_never_released_from_its_head_log(built):
    """No chain entries, but ledger rows nothing chains: a tampered store, not one removed; retiring is refused."""
    log = head_log_path(built)
    before = log.read_bytes()
    _tamper(built, "DELETE FROM chain")
    line = _one_line_refusal(_retire(built, "--by", "alice", "--reason", "start again"))
    assert str(built) in line and "retired only for a store removed or without a chain" in line
    assert log.read_bytes() == before and not list(log.parent.glob("*.retired-*"))


def test_a_head_log_the_setting_chose_is_retired_beside_it_and_its_path_is_not_repeated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir(mode=0o700)
    monkeypatch.setenv(ENV_HEAD_LOG, str(elsewhere / "store.heads"))
    store = tmp_path / "w" / "audit.db"
    db = open_store(store)
    set_cap(db, "pop", 1.0, "alice", "initial")
    db.close()
    shutil.rmtree(store.parent)
    assert RETIRE in _refused(store)
    done = _retire(store, "--by", "alice", "--reason", "removed on purpose")
    assert done.exit_code == 0, done.output
    (retired,) = elsewhere.glob("store.heads.retired-*")
    assert f"kept as {retired.name!r} beside {ENV_HEAD_LOG}" in done.stdout and str(elsewhere) not in done.stdout
    assert json.loads(retired.read_bytes().splitlines()[-1])["retired_head"]["entries"] == 2
    check_store(store)  # starts from nothing


def test_a_head_log_that_cannot_be_written_is_reported_after_the_commit(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_HEAD_LOG, str(tmp_path))  # a directory: cannot be appended to
    db = open_store(tmp_path / "audit.db")
    with pytest.raises(StoreUnavailable, match="committed but its head log") as refused:
        set_cap(db, "pop", 1.0, "alice", "initial")
    assert "\n" not in str(refused.value)
    assert db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == 1
    db.close()


# --- 4. Store errors during a write ----------------------------------------------------------


@pytest.fixture
def short_lock(monkeypatch):
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 1500)
    monkeypatch.setattr(store_module, "LOCK_NOTICE_MS", 200)


def _hold_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_lock_held_past_the_busy_timeout_is_store_unavailable_after_saying_it_waits(built, short_lock, caplog):
    db = open_store(built)
    holder = _hold_lock(built)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="kepsilon.audit"):
        with pytest.raises(StoreUnavailable) as refused:
            set_cap(db, "pop", 3.0, "alice", "raised")
    waited = time.monotonic() - started
    holder.rollback()
    holder.close()
    message = str(refused.value)
    assert 1.4 <= waited < 5 and "\n" not in message and "locked by another process" in message
    assert "nothing was written" in message
    (notice,) = [r.getMessage() for r in caplog.records if "waiting for the audit store lock" in r.getMessage()]
    assert "will wait up to 1 s more" in notice
    assert budget(db, "pop")["cap"] == 2 * 10**9
    db.close()


def test_a_lock_released_in_time_lets_the_write_through_after_the_notice(built, short_lock, caplog):
    db = open_store(built)
    holder = _hold_lock(built)
    threading.Timer(0.6, holder.rollback).start()
    with caplog.at_level(logging.WARNING, logger="kepsilon.audit"):
        set_cap(db, "pop", 3.0, "alice", "raised")
    holder.close()
    assert any("waiting for the audit store lock" in r.getMessage() for r in caplog.records)
    assert budget(db, "pop")["cap"] == 3 * 10**9
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 1500  # restored after the wait
    db.close()


def test_a_quick_write_says_nothing_about_locks(built, caplog):
    db = open_store(built)
    with caplog.at_level(logging.WARNING, logger="kepsilon.audit"):
        set_cap(db, "pop", 3.0, "alice", "raised")
    assert not caplog.records
    db.close()


def test_a_read_only_store_is_store_unavailable(built):
    db = sqlite_utils.Database(sqlite3.connect(f"file:{built}?mode=ro", uri=True))
    with pytest.raises(StoreUnavailable, match="read-only") as refused:
        set_cap(db, "pop", 3.0, "alice", "raised")
    assert "\n" not in str(refused.value) and "SQLITE_READONLY" in str(refused.value)
    db.close()


def test_a_full_disk_is_store_unavailable_and_writes_nothing(built):
    db = open_store(built)
    entries = db.execute("SELECT COUNT(*) FROM chain").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(StoreUnavailable, match="cannot grow") as refused:
        for _ in range(1000):
            set_cap(db, "pop", 3.0, "alice", "raised " + "x" * 2000)
            entries += 1
    assert "\n" not in str(refused.value) and "x" * 20 not in str(refused.value)
    assert db.execute("SELECT COUNT(*) FROM chain").fetchone()[0] == entries  # the failed call left nothing
    assert verify_chain(db) == (True, [])
    db.close()


def test_opening_a_corrupt_file_is_store_unavailable_in_one_line(tmp_path):
    junk = tmp_path / "audit.db"
    junk.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(StoreUnavailable) as refused:
        open_store(junk)
    message = str(refused.value)
    assert "\n" not in message and "not a database" in message and "kepsilon audit verify" in message


def test_store_errors_are_kepsilon_errors():
    assert issubclass(StoreUnavailable, KepsilonError) and issubclass(StoreCompromised, KepsilonError)


# --- 3. The officers' commands on a broken store ------------------------------------------------

runner = CliRunner()
COMMANDS = [
    ["budget", "pop"], ["policy"], ["who", "rel-1"], ["provenance", "rel-1"], ["impact", "--source-sha", "d" * 64],
    ["reruns"], ["noise-draws"], ["failures"], ["scale-basis"], ["unseals"],
    ["set-cap", "pop", "9", "--by", "alice", "--reason", "r"],
    ["approve", "rel-1", "--spec-hash", "a" * 64, "--by", "carol", "--reason", "ok"],
    ["unseal", "rel-1", "--by", "erin", "--reason", "r", "--out", "-"],
]


def _one_line_refusal(result, hint="kepsilon audit verify"):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (sqlite3.Error, KepsilonError))
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and hint in line
    return line


def test_every_officer_command_refuses_a_tampered_store_in_one_line(built, tmp_path):
    _tamper(built, f"UPDATE ledger SET nano_epsilon = 0 WHERE idempotency_key = '{MARKER}'")
    for command in COMMANDS + [["checkpoint", str(tmp_path / "head.json")]]:
        result = runner.invoke(audit_app, ["--db", str(built), *command])
        line = _one_line_refusal(result)
        assert "ledger#" in line, command
        assert not result.stdout, command
    assert not (tmp_path / "head.json").exists()
    db = sqlite3.connect(built)
    assert db.execute("SELECT COUNT(*) FROM approvals").fetchone()[0] == 0  # nothing written on a tampered store
    db.close()


def test_verify_lists_the_problems_then_says_so_in_one_line(built):
    _tamper(built, f"DELETE FROM ledger WHERE idempotency_key = '{MARKER}'")
    result = runner.invoke(audit_app, ["--db", str(built), "verify", "--format", "json"])
    _one_line_refusal(result, hint="listed above")
    import json

    listed = json.loads(result.stdout)
    assert listed[0]["ok"] is False and any("missing (deleted)" in row["problem"] for row in listed)


def test_verify_reports_a_rollback(built, tmp_path):
    backup = tmp_path / "backup.db"
    shutil.copy(built, backup)
    db = open_store(built)
    set_cap(db, "pop", 3.0, "alice", "raised")
    db.close()
    Path(str(built) + "-wal").unlink(missing_ok=True)
    Path(str(built) + "-shm").unlink(missing_ok=True)
    shutil.copy(backup, built)
    result = runner.invoke(audit_app, ["--db", str(built), "verify"])
    assert "rolled back" in _one_line_refusal(result, hint="listed above")
    assert "BROKEN" in result.stdout


@pytest.mark.parametrize("damage", ["not-a-database", "truncated", "invalid-utf8"])
def test_verify_and_budget_on_a_corrupt_file_answer_in_one_line(built, damage):
    data = bytearray(built.read_bytes())
    if damage == "not-a-database":
        data[:16] = b"garbage garbage "
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[_occurrences(bytes(data), MARKER.encode())[0] + 4] = 0xFF
    built.write_bytes(bytes(data))
    _one_line_refusal(runner.invoke(audit_app, ["--db", str(built), "budget", "pop"]))
    _one_line_refusal(runner.invoke(audit_app, ["--db", str(built), "verify"]), hint="listed above")


def test_an_intact_store_still_answers_and_verify_shows_the_head_log(built):
    result = runner.invoke(audit_app, ["--db", str(built), "budget", "pop", "--format", "json"])
    assert result.exit_code == 0 and '"remaining": 0.0' in result.stdout
    verified = runner.invoke(audit_app, ["--db", str(built), "verify", "--format", "json"])
    assert verified.exit_code == 0 and "contains the logged head" in verified.stdout


# --- 4. Witnesses outside the store: exported checkpoints (issue 24.1) -------------------------------


def test_a_checkpoint_exported_again_to_the_same_path_catches_an_older_store_put_back_with_its_log(built, tmp_path):
    from kepsilon.audit.chain import write_checkpoint

    exported = tmp_path / "elsewhere" / "checkpoint.json"
    db = open_store(built)
    write_checkpoint(db, exported)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    backup, log_backup = tmp_path / "backup.db", tmp_path / "backup.heads"
    shutil.copy(built, backup)
    shutil.copy(head_log_path(built), log_backup)
    db = open_store(built)
    set_cap(db, "pop", 3.0, "alice", "raised")
    _release(db, 3)
    write_checkpoint(db, exported)  # the officer's nightly export, to the same file
    db.close()
    for suffix in ("-wal", "-shm"):
        Path(str(built) + suffix).unlink(missing_ok=True)
    shutil.copy(backup, built)
    shutil.copy(log_backup, head_log_path(built))
    message = _refused(built)
    assert "rolled back" in message and "the exported checkpoint" in message and "checkpoint.json" in message


def test_published_manifests_of_another_population_or_malformed_are_not_witnesses_for_a_release(built, tmp_path):
    from kepsilon.audit.witness import find_witnesses

    out = tmp_path / "out"
    for name, document in {
        "theirs": {"population_id": "other", "audit_chain": {"entries": 10**6, "head_hash": "ab" * 32}},
        "broken": "not json",
        "no-witness": {"population_id": "pop"},
        "bad-hash": {"population_id": "pop", "audit_chain": {"entries": 10**6, "head_hash": "zz"}},
    }.items():
        (out / name).mkdir(parents=True)
        (out / name / "manifest.json").write_text(document if isinstance(document, str) else json.dumps(document))
    assert find_witnesses([out], "pop") == []
    check_store(built, manifests_in=[out], population="pop")  # none of them counts for 'pop'
    assert "rolled back" in str(pytest.raises(StoreCompromised, check_store, built, manifests_in=[out]).value)


def test_a_head_log_left_beside_the_store_by_an_earlier_version_is_moved_out_and_still_checked(tmp_path, monkeypatch):
    store = tmp_path / "audit.db"
    legacy = Path(str(store) + ".heads")
    monkeypatch.setenv(ENV_HEAD_LOG, str(legacy))  # where an earlier version wrote it
    db = open_store(store)
    set_cap(db, "pop", 2.0, "alice", "initial")
    db.close()
    logged = legacy.read_bytes()
    monkeypatch.delenv(ENV_HEAD_LOG)
    check_store(store)
    assert not legacy.exists() and default_head_log(store).read_bytes() == logged
    assert oct(default_head_log(store).stat().st_mode & 0o777) == "0o600"
