"""Integrity of the audit store: verify the hash chain, export its head as a checkpoint.

Entry n's hash is SHA-256(hash of entry n−1 + canonical JSON of the row it covers), recomputed here
from the rows as stored. That detects a row edited after its triggers were dropped (its entry, or the
next one, no longer matches), a deleted row (its entry points at nothing), a row inserted outside the
chain, and — against a checkpoint exported outside the store — a truncated tail or a rewritten history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import sqlite_utils

from kepsilon.tasks.errors import KepsilonError

from .store import (
    AUDITED_TABLES,
    GENESIS_HASH,
    PROTECTED_TABLES,
    append,
    chain_hash,
    now,
    row_content,
    write_transaction,
)

CHECKPOINT_FORMAT = "kepsilon-audit-checkpoint/1"


class ChainBroken(KepsilonError):
    """The chain does not verify; no checkpoint may bless it."""


def _check_entries(conn, problems: list[str]) -> tuple[int, dict[int, str]]:
    """Recompute every entry; returns the entry count and hash by seq."""
    hashes: dict[int, str] = {}
    previous = GENESIS_HASH
    expected_seq = 1
    for seq, table, row_id, stored in conn.execute("SELECT seq, table_name, row_id, entry_hash FROM chain ORDER BY seq"):
        if seq != expected_seq:
            problems.append(f"chain entries {expected_seq}..{seq - 1} are missing")
        expected_seq = seq + 1
        content = row_content(conn, table, row_id) if table in AUDITED_TABLES else None
        if content is None:
            problems.append(f"chain entry {seq}: row {table}#{row_id} is missing (deleted)")
        elif chain_hash(previous, content) != stored:
            problems.append(f"chain entry {seq}: row {table}#{row_id} does not match its hash (edited, or chain altered)")
        # Continue from the stored hash so one tampered entry is reported once, not as a cascade.
        previous = stored
        hashes[seq] = stored
    return expected_seq - 1, hashes


def _check_coverage(conn, problems: list[str]) -> None:
    """Every row of every audited table must be covered by a chain entry."""
    for table in AUDITED_TABLES:
        unchained = conn.execute(
            f"SELECT COUNT(*) FROM (SELECT rowid FROM [{table}] EXCEPT SELECT row_id FROM chain WHERE table_name = ?)",
            (table,),
        ).fetchone()[0]
        if unchained:
            problems.append(f"table {table}: {unchained} row(s) not covered by the chain (inserted outside it)")


def _check_triggers(conn, problems: list[str]) -> None:
    present = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    for table in PROTECTED_TABLES:
        for action in ("update", "delete"):
            if f"{table}_no_{action}" not in present:
                problems.append(f"table {table}: append-only trigger against {action.upper()} is missing")


def _check_head(label: str, count: int, head: str, length: int, hashes: dict[int, str], problems: list[str]) -> None:
    if length < count:
        problems.append(f"{label}: the chain has {length} entries, fewer than the {count} checkpointed (truncated)")
    elif count > 0 and hashes.get(count) != head:
        problems.append(f"{label}: entry {count} does not match the checkpointed head (history rewritten)")


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint file written by ``write_checkpoint``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KepsilonError(f"parameter 'checkpoint': cannot read {str(path)!r} ({type(exc).__name__})") from None
    if data.get("format") != CHECKPOINT_FORMAT or not isinstance(data.get("entry_count"), int):
        raise KepsilonError(f"parameter 'checkpoint': {str(path)!r} is not a kepsilon audit checkpoint")
    return data


def verify_chain(db: sqlite_utils.Database, checkpoint: str | Path | None = None) -> tuple[bool, list[str]]:
    """Recompute the chain from the stored rows; compare with the last recorded checkpoint and ``checkpoint``.

    Returns ``(ok, problems)``; each problem names the table, row id and chain position affected.
    """
    conn = db.conn
    problems: list[str] = []
    length, hashes = _check_entries(conn, problems)
    _check_coverage(conn, problems)
    _check_triggers(conn, problems)
    last = conn.execute("SELECT entry_count, head_hash FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
    if last is not None:
        _check_head("last recorded checkpoint", last[0], last[1], length, hashes, problems)
    if checkpoint is not None:
        data = read_checkpoint(checkpoint)
        _check_head(f"checkpoint file {Path(checkpoint).name}", data["entry_count"], data["head_hash"], length, hashes, problems)
    return (not problems, problems)


def chain_head(db: sqlite_utils.Database) -> tuple[int, str]:
    """(number of entries, hash of the last entry) — the genesis hash for an empty chain."""
    row = db.conn.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    return (row[0], row[1]) if row else (0, GENESIS_HASH)


def write_checkpoint(db: sqlite_utils.Database, path: str | Path) -> dict:
    """Export the verified chain head (entry count + hash) to ``path`` and record the export in the store.

    Refuses (``ChainBroken``) when the chain does not verify, so a checkpoint never blesses tampering.
    The file is written atomically (temp file + rename); keep it outside the store's reach (another
    disk, a ticket, a signed e-mail). Returns the checkpoint as written.
    """
    path = Path(path)
    with write_transaction(db) as conn:
        ok, problems = verify_chain(db)
        if not ok:
            raise ChainBroken("the audit chain does not verify: " + "; ".join(problems))
        count, head = chain_head(db)
        database = conn.execute("PRAGMA database_list").fetchone()[2]
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            "store": database,
            "entry_count": count,
            "head_hash": head,
            "created_at": now(),
        }
        if database and path.resolve() == Path(database).resolve():
            raise KepsilonError("parameter 'path': the checkpoint must be a file outside the store")
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(checkpoint, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
        append(
            conn,
            "checkpoints",
            {"path": str(path.resolve()), "entry_count": count, "head_hash": head, "created_at": checkpoint["created_at"]},
        )
    return checkpoint
