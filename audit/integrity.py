"""The store check a release runs before it reserves ε, and that every officer's command runs first.

Why: triggers stop honest mistakes, not someone who can write the file. A ledger edited after dropping
its trigger, a deleted reserve row, a flipped byte or a restored older copy would otherwise let a
release spend beyond its cap while ``budget`` shows nothing wrong. ``check_store`` refuses such a store
with ``StoreCompromised``; ``inspect_store`` returns every problem for ``kepsilon audit verify``.

What is checked, in one read snapshot:

1. SQLite's ``PRAGMA integrity_check`` — page structure *and* that every index matches its table (a
   corrupt ``ledger`` index would make the budget sums skip rows; ``quick_check`` does not look there).
2. The hash chain (``chain.verify_chain``): every row of every audited table, the ledger included, is
   exactly the row its chain entry committed — no edited, deleted or unchained row — and the
   append-only triggers are still in place.
3. The head log (``headlog.py``), read *before* the snapshot so a commit racing the check cannot look
   like a rollback: the chain must be at least as long as the longest logged head and hold every
   logged head (of the log's last 256 KiB) at its position. Longer is fine: a crash can fall between
   a commit and its log line. Once the chain has entries, a missing or empty log is a problem: the log
   lives outside the store's folder (``headlog.default_head_log``), so its absence means it was deleted
   or the setting changed, and staying silent would hide exactly the rollback it is there to catch.
4. The published manifests (``witness.py``), when the caller names folders to look in: each carries the
   chain's head at its publication, and the chain must hold it. The store's own list of its output
   folders is read too, but only as a hint (a rolled-back store does not know its newer releases).
5. The signatures (``principals.check_signatures``) once the store has principals: each re-verified with
   the key registered at its place in the chain, its signer's role, and the row it covers.
6. The checkpoint files the store recorded exporting (``kepsilon audit checkpoint``), where still
   present: exported again to the same path later, a file knows a head an older copy of the store lacks.

Cost, measured by ``benchmarks/bench_audit.py``: linear in the number of chain entries; for 100,000
ledger entries about 0.8 s on a 2-core machine (docs/performance.md). ``integrity_check`` runs in a thread
on its own connection, overlapping the chain walk when a second core is free.
"""

from __future__ import annotations

import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from .chain import verify_chain
from .errors import VERIFY_HINT, StoreCompromised, error_label, sqlite_cause
from .headlog import (
    ENV_HEAD_LOG,
    RETIRE_COMMAND,
    LoggedHead,
    adopt_legacy_head_log,
    head_log_named,
    head_log_path,
    head_log_place,
    most_advanced,
    read_heads,
)
from .store import GENESIS_HASH, busy_timeout_ms, database_file
from .witness import Witness, compare_with_witnesses, find_witnesses, published_folders

__all__ = ["RETIRE_HINT", "Inspection", "StoreCompromised", "check_store", "inspect_chain", "inspect_store"]

RETIRE_HINT = f"if the store was removed on purpose to start from nothing, retire its head log: {RETIRE_COMMAND}"

# SQLite stops after this many integrity_check messages; a handful is enough to say what is wrong.
_INTEGRITY_MESSAGES = 5


@dataclass
class Inspection:
    """The outcome of ``inspect_store``: the chain's head and every problem found (none: intact)."""

    store: str
    entries: int = 0
    head_hash: str = GENESIS_HASH
    problems: list[str] = field(default_factory=list)
    head_log: str = ""  # what the head-log comparison found, for display
    publications: str = "not checked"  # what the comparison with published manifests found, for display
    signatures: str = "not checked"  # whether acts are signed (principals.py) and what their check found

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self, hint: str = VERIFY_HINT) -> str:
        """One line naming the most telling problem, for ``StoreCompromised`` and the CLI's stderr.

        A rollback or a damaged file first, then the ledger (it is what ε is spent against), then other rows.
        """
        first = min(self.problems, key=_telling)
        more = len(self.problems) - 1
        extra = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        return f"audit store {self.store!r} failed its integrity check: {first}{extra}; refused — {hint}"


def _telling(problem: str) -> int:
    for rank, marks in enumerate((("rolled back", "rewritten"), ("SQLite", "the file", "head log"), ("signature",), ("ledger",),
                                  ("chain entry",))):
        if any(mark in problem for mark in marks):
            return rank
    return 4


def check_store(
    db_or_path: sqlite_utils.Database | sqlite3.Connection | str | Path,
    head_log: Path | None = None,
    manifests_in: list[Path] | None = None,
    population: str | None = None,
) -> None:
    """Refuse a corrupt, tampered-with or rolled-back audit store; return quietly if it is intact.

    Call it right before reserving ε (and before answering from the store). ``db_or_path`` is an open
    store or its path (a path that does not exist is a store not created yet: nothing to check, unless
    the head log says it had entries). ``head_log`` defaults to env KEPSILON_AUDIT_HEAD_LOG, else the
    store's log in the state folder (``headlog.default_head_log``). ``manifests_in``: folders of published releases whose manifests must agree
    with the chain (a release passes its spec's output folder; the store's own output folders of
    ``population`` are added). Raises ``StoreCompromised`` with a one-line message that names the problem
    and says to run ``kepsilon audit verify``; never a raw SQLite error.
    """
    inspection = inspect_store(db_or_path, head_log, manifests_in=manifests_in, population=population)
    if not inspection.ok:
        raise StoreCompromised(inspection.summary())


def inspect_store(
    db_or_path: sqlite_utils.Database | sqlite3.Connection | str | Path,
    head_log: Path | None = None,
    checkpoint: str | Path | None = None,
    manifests_in: list[Path] | None = None,
    population: str | None = None,
) -> Inspection:
    """Every problem of the store (integrity, chain, triggers, checkpoints, head log, publications), without
    raising for them.

    ``checkpoint`` is an exported checkpoint file to compare with as well (``kepsilon audit verify
    --checkpoint``); an unreadable checkpoint file raises ``KepsilonError`` (it is the caller's input).
    ``manifests_in``: folders of published releases to compare with (None: publications not checked);
    with ``population``, only that population's manifests count.
    """
    if isinstance(db_or_path, (str, Path)):
        path = Path(db_or_path)
        inspection = Inspection(store=str(path))
        if head_log is None:
            _adopt_legacy_log(path, inspection)
        log_path = head_log_path(path, head_log)
        heads = _read_log(log_path, inspection)
        witnesses = _published_witnesses(path, manifests_in, population, inspection)
        if not path.exists():
            _compare_with_log(None, 0, heads, log_path, inspection)
            _compare_with_publications(None, 0, witnesses, inspection)
            return inspection
        try:
            conn = sqlite3.connect(str(path), timeout=busy_timeout_ms() / 1000)
        except sqlite3.Error as error:
            inspection.problems.append(f"the file cannot be opened ({error_label(error)})")
            return inspection
        try:
            _inspect(conn, inspection, heads, log_path, checkpoint, witnesses)
        finally:
            conn.close()
        return inspection
    conn = db_or_path.conn if isinstance(db_or_path, sqlite_utils.Database) else db_or_path
    store = database_file(conn)
    inspection = Inspection(store=store or "(in memory)")
    store_log = head_log_path(store, head_log) if store else None
    heads = _read_log(store_log, inspection) if store_log else []
    witnesses = _published_witnesses(store, manifests_in, population, inspection) if store else None
    _inspect(conn, inspection, heads, store_log, checkpoint, witnesses)
    return inspection


def inspect_chain(path: str | Path) -> Inspection:
    """The store's own checks (SQLite's integrity check, the hash chain, the signatures) and its chain's length,
    without its head log, published manifests or checkpoints: what retiring its head log needs to know.

    A missing file is a store with no chain (nothing is created). The head log is left out on purpose: it is
    what is being retired, and with it a store without a chain always fails as rolled back.
    """
    path = Path(path)
    inspection = Inspection(store=str(path))
    if not path.exists():
        return inspection
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=busy_timeout_ms() / 1000)
    except sqlite3.Error as error:
        inspection.problems.append(f"the file cannot be opened ({error_label(error)})")
        return inspection
    try:
        _inspect(conn, inspection, [], None, None)
    finally:
        conn.close()
    return inspection


def _adopt_legacy_log(path: Path, inspection: Inspection) -> None:
    """Move an earlier version's log (beside the store) to the default place before it is read."""
    try:
        adopt_legacy_head_log(path)
    except OSError as error:
        inspection.problems.append(
            f"its head log beside the store cannot be moved to its new place ({type(error).__name__}); "
            f"move it by hand or set {ENV_HEAD_LOG} to it"
        )


def _published_witnesses(store, manifests_in, population, inspection: Inspection) -> list[Witness] | None:
    """The published manifests' witnesses, read *before* the snapshot: every head they name was committed
    before its folder was moved into place, so a release published while we check cannot look like a rollback.
    Exported checkpoint files the store recorded count as witnesses too, whenever the store is checked."""
    witnesses = _recorded_checkpoints(store)
    if manifests_in is None:
        return witnesses or None
    folders = [Path(folder) for folder in manifests_in] + published_folders(store, population)
    return witnesses + find_witnesses(folders, population)


def _recorded_checkpoints(store) -> list[Witness]:
    """The checkpoint files the store says it exported, as they are now (a later export to the same path
    knows a newer head). Unreadable or foreign files are skipped: they are the officer's, not ours."""
    from .chain import read_checkpoint
    from .witness import _HASH

    try:
        conn = sqlite3.connect(f"{Path(store).resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout_ms() / 1000)
    except sqlite3.Error:
        return []
    try:
        paths = [row[0] for row in conn.execute("SELECT DISTINCT path FROM checkpoints")]
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    found = []
    for path in paths:
        if not path or not Path(path).is_file():
            continue
        try:
            data = read_checkpoint(path)
        except Exception:  # noqa: BLE001 - any unreadable file is skipped, as documented
            continue
        head = data.get("head_hash")
        if data["entry_count"] >= 0 and isinstance(head, str) and _HASH.match(head):
            found.append(Witness(Path(path), "", data["entry_count"], head, kind="the exported checkpoint"))
    return found


def _inspect(conn, inspection: Inspection, heads, log_path: Path | None, checkpoint, witnesses=None) -> None:
    began = not conn.in_transaction
    try:
        if began:
            conn.execute("BEGIN")
        _inspect_snapshot(conn, inspection, heads, log_path, checkpoint, witnesses)
    except sqlite3.Error as error:
        cause = sqlite_cause(error)
        if cause is None:
            raise
        inspection.problems.append(f"the file {cause} ({error_label(error)})")
    finally:
        if began and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")


def _inspect_snapshot(conn, inspection: Inspection, heads, log_path, checkpoint, witnesses=None) -> None:
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "chain" not in tables:
        if tables:
            inspection.problems.append("the file is a SQLite database but not a kepsilon audit store (no chain table)")
        else:  # an empty file: a store whose schema was never created
            _compare_with_log(conn, 0, heads, log_path, inspection)
            _compare_with_publications(None, 0, witnesses, inspection)
        return
    store = database_file(conn)
    if store:
        # SQLite releases the GIL while it checks pages: with a second core free, the integrity check
        # runs in the chain walk's shadow (100,000 entries: 0.50 s instead of 0.75 s, measured).
        with ThreadPoolExecutor(max_workers=1) as pool:
            integrity = pool.submit(_integrity_check, store)
            ok, problems = verify_chain(conn, checkpoint)
            inspection.problems.extend(integrity.result())
    else:
        inspection.problems.extend(_integrity_problems(conn))
        ok, problems = verify_chain(conn, checkpoint)
    inspection.problems.extend(problems)
    _check_signatures(conn, inspection)
    inspection.entries, inspection.head_hash = _head(conn)
    if not heads and inspection.entries > 0 and log_path is not None:
        heads = _read_log(log_path, Inspection(store=inspection.store))  # a first commit's line may be just written
    _compare_with_log(conn, inspection.entries, heads, log_path, inspection)
    _compare_with_publications(conn, inspection.entries, witnesses, inspection)


def _check_signatures(conn, inspection: Inspection) -> None:
    """Every signature re-checked (``principals.check_signatures``); an unsigned store is said to be one."""
    from .principals import check_signatures, is_signed

    if not is_signed(conn):
        inspection.signatures = "none: no principals registered, acts are attributed by name, not authenticated"
        return
    problems = check_signatures(conn)
    inspection.problems.extend(message for _, message in problems)
    inspection.problems.extend(_recorded_checkpoint_signatures(conn))
    count = conn.execute("SELECT COUNT(*) FROM signatures").fetchone()[0]
    inspection.signatures = f"{count} signature(s), {len(problems)} problem(s)" if problems else f"{count} signature(s) verified"


def _recorded_checkpoint_signatures(conn) -> list[str]:
    """The exported checkpoint files the store recorded that carry a signature: each must verify (a file from
    before the store had principals carries none and is left alone)."""
    from .chain import read_checkpoint
    from .principals import checkpoint_signature_problem

    problems = []
    for (path,) in conn.execute("SELECT DISTINCT path FROM checkpoints"):
        if not path or not Path(path).is_file():
            continue
        try:
            data = read_checkpoint(path)
        except Exception:  # noqa: BLE001 - an unreadable file is the officer's, as for the witnesses
            continue
        if "signature" in data:
            problem = checkpoint_signature_problem(conn, data)
            if problem is not None:
                problems.append(f"checkpoint file {path!r}: {problem}")
    return problems


def _compare_with_publications(conn, entries: int, witnesses: list[Witness] | None, inspection: Inspection) -> None:
    if witnesses is None:
        return
    problems, summary = compare_with_witnesses(conn, entries, witnesses)
    inspection.problems.extend(problems)
    inspection.publications = summary


def _integrity_check(store: str) -> list[str]:
    """``_integrity_problems`` on a connection of its own, so it can run in a thread."""
    try:
        conn = sqlite3.connect(store, timeout=busy_timeout_ms() / 1000)
    except sqlite3.Error as error:
        return [f"the file cannot be opened ({error_label(error)})"]
    try:
        return _integrity_problems(conn)
    except sqlite3.Error as error:
        if sqlite_cause(error) is None:
            raise
        return [f"the file {sqlite_cause(error)} ({error_label(error)})"]
    finally:
        conn.close()


def _integrity_problems(conn) -> list[str]:
    """SQLite's ``integrity_check``: page structure, and every index against its table (``quick_check``
    skips the latter, yet a corrupt ``ledger`` index would make the budget sums skip rows)."""
    messages = [row[0] for row in conn.execute(f"PRAGMA integrity_check({_INTEGRITY_MESSAGES})")]
    # SQLite's messages can span lines ("*** in database main ***\n…"); each problem stays one line.
    return [] if messages == ["ok"] else [f"SQLite integrity_check: {' '.join(m.split())}" for m in messages]


def _head(conn) -> tuple[int, str]:
    row = conn.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    return (row[0], row[1]) if row else (0, GENESIS_HASH)


def _read_log(path: Path, inspection: Inspection) -> list[LoggedHead]:
    try:
        heads, unreadable = read_heads(path)
    except OSError as error:
        inspection.problems.append(f"{head_log_named(path)} cannot be read ({type(error).__name__})")
        return []
    if unreadable and not heads:
        inspection.problems.append(f"{head_log_named(path)} has no readable line (damaged, or not a head log)")
    return heads


def _compare_with_log(conn, entries: int, heads: list[LoggedHead], log_path: Path | None, inspection: Inspection) -> None:
    """The chain must hold the most advanced logged head: same hash at that length (longer is fine)."""
    if log_path is None:
        inspection.head_log = "not checked (in-memory store)"
        return
    latest = most_advanced(heads)
    if latest is None:
        if entries > 0:
            inspection.problems.append(
                f"{head_log_named(log_path)} is missing or empty, but the store has {entries} chain entries "
                f"(deleted, or {ENV_HEAD_LOG} changed): restore it, or set {ENV_HEAD_LOG} to where it is"
            )
            inspection.head_log = f"missing at {head_log_place(log_path)}"
            return
        inspection.head_log = f"none yet at {head_log_place(log_path)} (the store has no entries)"
        return
    if entries < latest.entries:
        what, cause = f"has {entries} chain entries", "a deleted -wal file, or an older copy restored"
        if conn is None or entries == 0:
            # A store removed on purpose looks the same: the refusal names the recorded way out. Never offered
            # for a store with some entries, which is a real rollback (retire-head-log refuses it anyway).
            what, cause = "has no chain", f"{cause}; {RETIRE_HINT}"
        inspection.problems.append(
            f"rolled back: the store {what}, but its head log recorded {latest.entries} at {latest.at} ({cause})"
        )
        inspection.head_log = f"behind the log ({entries} < {latest.entries})"
        return
    # Every logged head must be in the chain, not only the latest: each line is a commit that happened.
    for head in sorted(set(heads), key=lambda head: -head.entries):
        if head.entries == 0:
            continue
        row = conn.execute("SELECT entry_hash FROM chain WHERE seq = ?", (head.entries,)).fetchone()
        if row is None or row[0] != head.head_hash:
            inspection.problems.append(
                f"rewritten: chain entry {head.entries} differs from the head its log recorded at {head.at} "
                "(history replaced, or another store)"
            )
            inspection.head_log = f"differs at entry {head.entries}"
            return
    inspection.head_log = f"contains the logged head (entry {latest.entries}, {latest.at})"
