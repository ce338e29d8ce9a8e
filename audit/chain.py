"""Integrity of the audit store: verify the hash chain, export its head as a checkpoint.

Entry n's hash is SHA-256(hash of entry n−1 + canonical JSON of the row it covers), recomputed here
from the rows as stored. That detects a row edited after its triggers were dropped (its entry, or the
next one, no longer matches), a deleted row (its entry points at nothing), a row inserted outside the
chain, and — against a checkpoint exported outside the store — a truncated tail or a rewritten history.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import sqlite_utils

from kepsilon.tasks.errors import KepsilonError

from .errors import error_label, sqlite_cause
from .principals import authorise, checkpoint_signature_problem, record_signature
from .signing import SignedAct
from .store import (
    AUDITED_TABLES,
    GENESIS_HASH,
    PROTECTED_TABLES,
    RowEncoder,
    append,
    now,
    write_transaction,
)

CHECKPOINT_FORMAT = "kepsilon-audit-checkpoint/1"


class ChainBroken(KepsilonError):
    """The chain does not verify; no checkpoint may bless it."""


def _connection(db) -> sqlite3.Connection:
    """The sqlite3 connection of a sqlite_utils Database, or the connection itself."""
    return db.conn if isinstance(db, sqlite_utils.Database) else db


def _check_entries(conn, problems: list[tuple[int, str]]) -> int:
    """Recompute every entry from its row and the stored hash before it; returns the entry count.

    Each entry is checked on its own against its predecessor's *stored* hash, so one tampered entry is
    reported once, not as a cascade. The chain is read in order while each table is read alongside it
    in rowid order (rows are chained in the order they are inserted), so nothing is held in memory and
    each row is fetched once. The same walk finds rows that no entry covers (inserted outside the
    chain) and entries whose row is gone (deleted).
    """
    sha256 = hashlib.sha256
    tables: dict[str, _TableRows] = {}
    present = _present_tables(conn)
    previous, expected, count = GENESIS_HASH, 1, 0
    for seq, table, row_id, stored in conn.execute("SELECT seq, table_name, row_id, entry_hash FROM chain ORDER BY seq"):
        count += 1
        if seq != expected:
            problems.append((seq, f"chain entry {seq}: entries {expected}..{seq - 1} before it are missing"))
        expected = seq + 1
        rows = tables.get(table)
        if rows is None:
            if table not in AUDITED_TABLES or table not in present:
                why = "not an audited table" if table not in AUDITED_TABLES else "its table is gone"
                problems.append((seq, f"chain entry {seq}: row {table}#{row_id} is missing ({why})"))
                previous = stored
                continue
            rows = tables[table] = _TableRows(conn, table)
        current = rows.current
        if current is not None and current[0] == row_id:  # the usual case: the next row of its table
            rows.current = next(rows.cursor, None)
            values = current
        else:
            values = rows.take(row_id)
        if values is None:
            problems.append((seq, f"chain entry {seq}: row {table}#{row_id} is missing (deleted)"))
        elif sha256((previous + rows.content(values)).encode("utf-8")).hexdigest() != stored:
            problems.append((seq, f"chain entry {seq}: row {table}#{row_id} does not match its hash (edited, or chain altered)"))
        previous = stored
    for table in AUDITED_TABLES:
        rows = tables.get(table)
        if rows is not None:
            uncovered = rows.left_over()
        elif table not in present:  # a store from before the migration that adds it (opening it migrates)
            continue
        else:
            uncovered = conn.execute(f"SELECT COUNT(*) FROM [{table}]").fetchone()[0]
        if uncovered:
            problems.append((count + 1, f"table {table}: {uncovered} row(s) not covered by the chain (inserted outside it)"))
    return count


def _present_tables(conn) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


class _TableRows:
    """One audited table read in rowid order, in step with the chain's entries for it."""

    def __init__(self, conn, table: str):
        self.conn, self.table = conn, table
        self.cursor = conn.execute(f"SELECT rowid, * FROM [{table}] ORDER BY rowid")
        self.content = RowEncoder(table, [d[0] for d in self.cursor.description][1:], offset=1).content
        self.current = next(self.cursor, None)
        self.passed: dict[int, tuple] = {}  # rows walked past without an entry (so far)

    def take(self, row_id: int):
        """The row for an entry that is not the next one in order: ahead, walked past, duplicated or gone."""
        current = self.current
        while current is not None and current[0] < row_id:
            self.passed[current[0]] = current
            current = next(self.cursor, None)
        if current is not None and current[0] == row_id:
            self.current = next(self.cursor, None)
            return current
        self.current = current
        if row_id in self.passed:
            return self.passed.pop(row_id)
        # Already taken by an earlier entry (a duplicated entry), or not there at all.
        return self.conn.execute(f"SELECT rowid, * FROM [{self.table}] WHERE rowid = ?", (row_id,)).fetchone()

    def left_over(self) -> int:
        """Rows no entry took."""
        rest = 0 if self.current is None else 1 + sum(1 for _ in self.cursor)
        return len(self.passed) + rest


# Problems are listed by chain position; those about the store as a whole come after the entries.
_AFTER_ENTRIES = 2**62


def _check_triggers(conn, problems: list[tuple[int, str]]) -> None:
    """Every protected table keeps both append-only triggers, and each still refuses (RAISE(ABORT …))."""
    present = {name: sql or "" for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")}
    tables = _present_tables(conn)
    for table in PROTECTED_TABLES:
        if table not in tables and table in AUDITED_TABLES[AUDITED_TABLES.index("principals"):]:
            continue  # not created yet: a store from before its migration, whose chain covers none of its rows
        for action in ("update", "delete"):
            name = f"{table}_no_{action}"
            if name not in present:
                problems.append((_AFTER_ENTRIES, f"table {table}: append-only trigger against {action.upper()} is missing"))
            elif "RAISE(ABORT" not in present[name].upper().replace(" ", ""):
                problems.append((_AFTER_ENTRIES, f"table {table}: append-only trigger against {action.upper()} no longer refuses"))


def _hash_at(conn, seq: int) -> str | None:
    row = conn.execute("SELECT entry_hash FROM chain WHERE seq = ?", (seq,)).fetchone()
    return row[0] if row else None


def _check_head(label: str, count: int, head: str, length: int, conn, problems: list[tuple[int, str]]) -> None:
    if length < count:
        problems.append((0, f"{label}: the chain has {length} entries, fewer than the {count} checkpointed (truncated)"))
    elif count > 0 and _hash_at(conn, count) != head:
        problems.append((0, f"{label}: entry {count} does not match the checkpointed head (history rewritten)"))


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint file written by ``write_checkpoint``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KepsilonError(f"parameter 'checkpoint': cannot read {str(path)!r} ({type(exc).__name__})") from None
    if data.get("format") != CHECKPOINT_FORMAT or not isinstance(data.get("entry_count"), int):
        raise KepsilonError(f"parameter 'checkpoint': {str(path)!r} is not a kepsilon audit checkpoint")
    return data


def verify_chain(db: sqlite_utils.Database | sqlite3.Connection, checkpoint: str | Path | None = None) -> tuple[bool, list[str]]:
    """Recompute the chain from the stored rows; compare with the last recorded checkpoint and ``checkpoint``.

    Returns ``(ok, problems)``; each problem names the table, row id and chain position affected. Reads
    one consistent snapshot (a concurrent writer cannot make a half-seen commit look like tampering).
    A file too damaged to read, or text that is not UTF-8, is reported as a problem, never raised:
    ``StoreUnavailable``/``StoreCompromised`` are for the callers (``integrity.py``) to decide.
    """
    conn = _connection(db)
    data = read_checkpoint(checkpoint) if checkpoint is not None else None
    problems: list[tuple[int, str]] = []
    factory = conn.text_factory
    with _snapshot(conn):
        try:
            try:
                _verify(conn, checkpoint, data, problems)
            except sqlite3.OperationalError as error:
                if "Could not decode to UTF-8" not in str(error):
                    raise
                # Corrupted text: read again leniently (U+FFFD for bad bytes), so the hash check names the
                # rows it sits in; strict decoding stays the fast, normal path.
                problems[:] = [(0, "the store holds bytes that are not valid UTF-8 text (corrupted file)")]
                conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
                _verify(conn, checkpoint, data, problems)
        except sqlite3.DatabaseError as error:
            cause = sqlite_cause(error)
            if cause is None:
                raise
            problems.append((0, f"the store file {cause}: SQLite stopped reading it ({error_label(error)})"))
        finally:
            conn.text_factory = factory
    problems.sort(key=lambda item: item[0])
    return (not problems, [message for _, message in problems])


def _verify(conn, checkpoint, data, problems: list[tuple[int, str]]) -> None:
    length = _check_entries(conn, problems)
    _check_triggers(conn, problems)
    last = conn.execute("SELECT entry_count, head_hash FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
    if last is not None:
        _check_head("last recorded checkpoint", last[0], last[1], length, conn, problems)
    if data is not None:
        _check_head(f"checkpoint file {Path(checkpoint).name}", data["entry_count"], data["head_hash"], length, conn, problems)
        problem = checkpoint_signature_problem(conn, data)
        if problem is not None:
            problems.append((0, f"checkpoint file {Path(checkpoint).name}: {problem}"))


@contextlib.contextmanager
def _snapshot(conn: sqlite3.Connection):
    """A read transaction (one WAL snapshot) unless the caller already holds one."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    try:
        yield
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def chain_head(db: sqlite_utils.Database | sqlite3.Connection) -> tuple[int, str]:
    """(number of entries, hash of the last entry) — the genesis hash for an empty chain."""
    row = _connection(db).execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    return (row[0], row[1]) if row else (0, GENESIS_HASH)


def write_checkpoint(db: sqlite_utils.Database, path: str | Path, signed: SignedAct | None = None) -> dict:
    """Export the verified chain head (entry count + hash) to ``path`` and record the export in the store.

    Refuses (``ChainBroken``) when the chain does not verify, so a checkpoint never blesses tampering.
    The file is written atomically (temp file + rename); keep it outside the store's reach (another
    disk, a ticket, a signed e-mail). Returns the checkpoint as written.

    In a store with principals the checkpoint must be ``signed`` by an officer's or admin's key over the
    head it exports (``principals.authorise``); the file then carries that signature, which ``verify
    --checkpoint`` re-checks, so a checkpoint file cannot be forged by someone without such a key.
    """
    path = Path(path)
    with write_transaction(db) as conn:
        ok, problems = verify_chain(db)
        if not ok:
            raise ChainBroken("the audit chain does not verify: " + "; ".join(problems))
        count, head = chain_head(db)
        authorised = authorise(conn, "checkpoint", signed, {"entry_count": count, "head_hash": head})
        database = conn.execute("PRAGMA database_list").fetchone()[2]
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            "store": database,
            "entry_count": count,
            "head_hash": head,
            "created_at": now(),
        }
        if authorised is not None:
            act = authorised.act  # the verified act: `signed` itself, no longer Optional
            checkpoint["signature"] = {"payload": act.payload, "public_key": act.public_key, "signature": act.signature}
        if database and path.resolve() == Path(database).resolve():
            raise KepsilonError("parameter 'path': the checkpoint must be a file outside the store")
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(checkpoint, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
        row = append(
            conn,
            "checkpoints",
            {"path": str(path.resolve()), "entry_count": count, "head_hash": head, "created_at": checkpoint["created_at"]},
        )
        record_signature(conn, authorised, "checkpoints", row)
    return checkpoint
