"""Published witnesses of the audit chain: the chain's head, as each release's public manifest recorded it.

Why: the store and its head log can be put back together from one backup, and then agree with each
other. The published folders are not part of that backup: each release's ``manifest.json`` carries
``audit_chain = {"entries": n, "head_hash": h}``: the chain's entry ``n`` — the one that sealed the
release's noise seed, committed after its reservation and before any noise was drawn. A store that lacks entry ``n``, or
holds another hash there, was rolled back (or replaced) after that release was published.

What the witness reveals (docs/private-store.md): ``head_hash`` is SHA-256 over the chain, whose rows
include the release's sealed seed (Fernet ciphertext of 32 random bytes, under a key outside the store)
and timestamps to the microsecond; someone who knows every other record cannot recompute it to test a
guess, so it confirms nothing about a private value. ``entries`` is the number of audit events the
store had recorded (caps, approvals, reservations, seeds, records — of every population in the store):
it says how busy the store was, nothing about a record.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from kepsilon.record import PublicManifest

from .store import GENESIS_HASH, busy_timeout_ms

FIELD = "audit_chain"
MANIFEST = "manifest.json"
_HASH = re.compile(r"^[0-9a-f]{64}$")
# A manifest larger than this is not one of ours (ours are a few KiB); skipped unread.
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Witness:
    """One published manifest's record of the chain: ``entries`` entries, the last hashing to ``head_hash``."""

    manifest: Path
    population_id: str
    entries: int
    head_hash: str
    kind: str = "the published manifest"


def chain_witness(store: str | Path, idempotency_key: str | None = None) -> dict:
    """The public manifest's ``audit_chain`` field: the chain entry of the release's sealed seed (found by
    ``idempotency_key``), else the store's committed head, read now.

    The sealed seed's entry, not the head at staging time: a rerun of an interrupted release reuses its
    reservation and seed, so it witnesses the same entry and its output stays byte-identical; and that
    entry's hash covers the seed's ciphertext, which no one outside the store can recompute.
    """
    conn = sqlite3.connect(str(store), timeout=busy_timeout_ms() / 1000)
    try:
        row = None
        if idempotency_key is not None:
            row = conn.execute(
                "SELECT chain.seq, chain.entry_hash FROM sealed_seeds JOIN chain ON chain.table_name = 'sealed_seeds' "
                "AND chain.row_id = sealed_seeds.id WHERE sealed_seeds.idempotency_key = ?",
                (idempotency_key,),
            ).fetchone()
        if row is None:
            row = conn.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    finally:
        conn.close()
    entries, head_hash = (row[0], row[1]) if row else (0, GENESIS_HASH)
    return {FIELD: {"entries": entries, "head_hash": head_hash}}


def with_chain_witness(public: PublicManifest, store: str | Path, idempotency_key: str | None = None) -> PublicManifest:
    """``public`` with the chain entry it witnesses added (see ``chain_witness`` and the module's docstring)."""
    return {**public, "audit_chain": chain_witness(store, idempotency_key)[FIELD]}


def published_folders(store: str | Path, population: str | None) -> list[Path]:
    """The folders the store says its published releases went to (of ``population``, or of all).

    Only hints: a rolled-back store does not know its newer releases, which is why callers add the
    spec's own output folder. A store without a ``releases`` table (new, empty) names none.
    """
    try:
        conn = sqlite3.connect(f"{Path(store).resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms() / 1000)
    except sqlite3.Error:
        return []
    try:
        query = "SELECT DISTINCT output_dir FROM releases WHERE outcome = 'published' AND output_dir IS NOT NULL"
        arguments: tuple = ()
        if population is not None:
            query += " AND population_id = ?"
            arguments = (population,)
        rows = conn.execute(query, arguments).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return sorted({Path(row[0]).parent for row in rows if row[0]})


def find_witnesses(folders: list[Path], population: str | None = None) -> list[Witness]:
    """Every ``<folder>/*/manifest.json`` with a well-formed ``audit_chain`` (of ``population`` if given).

    Unreadable or foreign files are skipped: a published folder is public and anyone may have put
    things there; only a well-formed witness counts.
    """
    found: list[Witness] = []
    seen: set[Path] = set()
    for folder in folders:
        try:
            candidates = sorted(Path(folder).glob(f"*/{MANIFEST}"))
        except OSError:
            continue
        for path in candidates:
            resolved = path.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            witness = _read_witness(path)
            if witness is not None and (population is None or witness.population_id == population):
                found.append(witness)
    return found


def _read_witness(path: Path) -> Witness | None:
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            return None
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or not isinstance(document.get(FIELD), dict):
        return None
    chain = document[FIELD]
    entries, head_hash = chain.get("entries"), chain.get("head_hash")
    if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
        return None
    if not isinstance(head_hash, str) or not _HASH.match(head_hash):
        return None
    return Witness(path, str(document.get("population_id", "")), entries, head_hash)


# A store with no chain beside publications of an earlier store: the way out when that store was removed on purpose.
# (Whoever may move the publications aside may also delete them: the witness guards against accidents and restores,
# as the head log does, docs/private-store.md.)
FRESH_STORE_HINT = ("; if the store was removed on purpose to start from nothing, move that store's publications out "
                    "of the output folder first")


def compare_with_witnesses(conn, entries: int, witnesses: list[Witness]) -> tuple[list[str], str]:
    """Problems (a rollback) and a one-line summary of the comparison of the chain with ``witnesses``.

    The chain must hold every witnessed head at its position; a chain shorter than the newest witness,
    or with another hash at a witnessed position, was rolled back or replaced after that publication.
    """
    if not witnesses:
        return [], "no published manifest found (rollback against publications not checked)"
    for witness in sorted(witnesses, key=lambda w: -w.entries):
        if witness.entries == 0:
            continue
        if entries < witness.entries:
            return [
                f"rolled back: the store has {entries} chain entries, but {witness.kind} "
                f"{str(witness.manifest)!r} witnessed {witness.entries} (an older copy of the store restored, "
                "with or without its head log)" + (FRESH_STORE_HINT if entries == 0 else "")
            ], f"behind the publications ({entries} < {witness.entries})"
        row = conn.execute("SELECT entry_hash FROM chain WHERE seq = ?", (witness.entries,)).fetchone()
        if row is None or row[0] != witness.head_hash:
            return [
                f"rewritten: chain entry {witness.entries} differs from the head {witness.kind} "
                f"{str(witness.manifest)!r} witnessed (an older copy restored and written to since, or another store)"
            ], f"differs from a publication at entry {witness.entries}"
    newest = max(witnesses, key=lambda w: w.entries)
    return [], f"holds every witnessed head ({len(witnesses)} witness(es), newest at entry {newest.entries})"
