"""The audit store: one SQLite file holding the ε ledger, release records, sealed seeds and approvals.

Every audited table is append-only twice over: triggers refuse UPDATE and DELETE, and each inserted
row is covered by a hash chain (``chain.py``) whose head can be exported outside the store, because
anyone who can write the file can also drop triggers.

All writes go through ``write_transaction`` (``BEGIN IMMEDIATE``), so a check and the insert it
guards, and the chain entry that covers the insert, are one atomic step even with many processes.
Every commit that extends the chain also appends the new head to the head log (``headlog.py``), a file
outside the database that lets the integrity check (``integrity.py``) see a rolled-back store.
SQLite failures that are the store's fault (locked too long, read-only, full disk, corrupt) become
``StoreUnavailable`` with a one-line message.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import sqlite_utils
from sqlite_utils.migrations import Migrations

from kepsilon import settings
from kepsilon.tasks.errors import SpecError

from .errors import StoreUnavailable, sqlite_cause, unavailable
from .headlog import append_head, check_head_log_place, head_log_named, head_log_path
from .private import (
    DEFAULT_FOLDER,
    check_not_shared,
    create_private_file,
    make_private_folder,
    owner_only,
)

# The store lives in the project's private folder (0700) by default, never loose in the project folder.
DEFAULT_PATH = str(DEFAULT_FOLDER / "audit.db")
# Where the store lived before it moved into the private folder: found there, it is not silently left behind.
LEGACY_PATH = "audit.db"
ENV_PATH = "KEPSILON_AUDIT_DB"
# Beside the store: held while a process switches a fresh store to WAL and applies the schema.
LOCK_SUFFIX = ".lock"
# Long enough for 16+ processes queueing on BEGIN IMMEDIATE; each transaction lasts milliseconds.
BUSY_TIMEOUT_MS = 60_000
# Seconds; a deployment (or a test) may shorten or lengthen the wait for another writer's lock.
ENV_BUSY_TIMEOUT = "KEPSILON_AUDIT_BUSY_TIMEOUT"
# A wait for the write lock longer than this is said out loud: a silent minute looks like a hang.
LOCK_NOTICE_MS = 2_000

log = logging.getLogger("kepsilon.audit")

# Tables whose rows are covered by the hash chain and protected by append-only triggers, in the
# order they were created. ``chain`` itself is protected by triggers and verified by recomputation.
AUDITED_TABLES = (
    "populations",
    "ledger",
    "releases",
    "parameters",
    "checks",
    "outputs",
    "stage_counts",
    "software",
    "sealed_seeds",
    "unseal_events",
    "approvals",
    "checkpoints",
    "advice_events",
    "principals",
    "signatures",
)
PROTECTED_TABLES = AUDITED_TABLES + ("chain",)
# Columns added by a migration after rows were already chained. While NULL they are left out of a row's
# hashed content, so rows chained before the migration keep their hash; once set they are covered.
LATER_COLUMNS = {
    "releases": frozenset(
        {"failure_reason", "l_diversity_min", "t_closeness_max", "homogeneous_groups", "prosecutor_risk",
         "privacy_model", "delta"}
    ),
    "ledger": frozenset({"atto_delta"}),
}

migrations = Migrations("kepsilon.audit")


@migrations(name="0001_audit_schema")
def _schema(db: sqlite_utils.Database) -> None:
    """Every table of the audit store; ε is stored as integer nano-ε (exact sums, no float drift)."""
    db.executescript(
        """
        CREATE TABLE populations (
            population_id TEXT PRIMARY KEY,
            created_at TEXT NOT NULL,
            created_by TEXT NOT NULL
        );
        -- One row per event; the state of a reservation is derived from later rows, never edited.
        CREATE TABLE ledger (
            id INTEGER PRIMARY KEY,
            population_id TEXT NOT NULL REFERENCES populations(population_id),
            kind TEXT NOT NULL CHECK (kind IN ('cap', 'reserve', 'spend', 'void')),
            nano_epsilon INTEGER NOT NULL CHECK (nano_epsilon >= 0),
            reservation_id INTEGER REFERENCES ledger(id),
            idempotency_key TEXT,
            release_id TEXT,
            actor TEXT NOT NULL,
            reason TEXT,
            created_at TEXT NOT NULL,
            CHECK ((kind IN ('spend', 'void')) = (reservation_id IS NOT NULL)),
            CHECK ((kind = 'reserve') = (idempotency_key IS NOT NULL))
        );
        CREATE INDEX ledger_population ON ledger(population_id, kind);
        CREATE INDEX ledger_key ON ledger(idempotency_key);
        CREATE INDEX ledger_reservation ON ledger(reservation_id);

        CREATE TABLE releases (
            id INTEGER PRIMARY KEY,
            release_id TEXT NOT NULL,
            population_id TEXT,
            idempotency_key TEXT,
            spec_hash TEXT,
            outcome TEXT NOT NULL CHECK (outcome IN ('published', 'failed', 'refused')),
            outcome_detail TEXT,
            reservation_id INTEGER REFERENCES ledger(id),
            k INTEGER,
            epsilon REAL,
            algorithm TEXT,
            scale_basis TEXT,
            mechanism TEXT,
            confidence REAL,
            suppression_budget REAL,
            source_path TEXT,
            source_sha256 TEXT,
            source_rows INTEGER,
            rows_in INTEGER,
            rows_published INTEGER,
            information_loss_measured REAL,
            information_loss_predicted REAL,
            linking_risk REAL,
            output_dir TEXT,
            seed_commitment TEXT,
            operator TEXT,
            flow_run_id TEXT,
            started_at TEXT,
            finished_at TEXT,
            kepsilon_version TEXT,
            git_commit TEXT,
            manifest TEXT NOT NULL,
            recorded_at TEXT NOT NULL
        );
        CREATE INDEX releases_release_id ON releases(release_id);
        CREATE INDEX releases_key ON releases(idempotency_key);
        CREATE INDEX releases_source ON releases(source_sha256);

        CREATE TABLE parameters (
            id INTEGER PRIMARY KEY,
            release INTEGER NOT NULL REFERENCES releases(id),
            name TEXT NOT NULL,
            value  -- no type affinity: numbers stay numbers, lists/dicts are canonical JSON text
        );
        CREATE INDEX parameters_release ON parameters(release);
        CREATE TABLE checks (
            id INTEGER PRIMARY KEY,
            release INTEGER NOT NULL REFERENCES releases(id),
            name TEXT NOT NULL,
            success INTEGER NOT NULL CHECK (success IN (0, 1))
        );
        CREATE INDEX checks_release ON checks(release);
        CREATE TABLE outputs (
            id INTEGER PRIMARY KEY,
            release INTEGER NOT NULL REFERENCES releases(id),
            path TEXT NOT NULL,
            sha256 TEXT
        );
        CREATE INDEX outputs_release ON outputs(release);
        CREATE TABLE stage_counts (
            id INTEGER PRIMARY KEY,
            release INTEGER NOT NULL REFERENCES releases(id),
            stage TEXT NOT NULL,
            rows_removed INTEGER
        );
        CREATE INDEX stage_counts_release ON stage_counts(release);
        CREATE TABLE software (
            id INTEGER PRIMARY KEY,
            release INTEGER NOT NULL REFERENCES releases(id),
            package TEXT NOT NULL,
            version TEXT
        );
        CREATE INDEX software_release ON software(release);
        CREATE INDEX software_package ON software(package, version);

        -- The seed only as Fernet ciphertext; the key lives outside this file.
        CREATE TABLE sealed_seeds (
            id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL UNIQUE,
            release_id TEXT NOT NULL,
            commitment TEXT NOT NULL,
            ciphertext BLOB NOT NULL,
            key_fingerprint TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX sealed_seeds_release ON sealed_seeds(release_id);
        CREATE TABLE unseal_events (
            id INTEGER PRIMARY KEY,
            sealed_seed INTEGER NOT NULL REFERENCES sealed_seeds(id),
            release_id TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            actor TEXT NOT NULL,
            reason TEXT NOT NULL,
            verified INTEGER NOT NULL CHECK (verified IN (0, 1)),
            created_at TEXT NOT NULL
        );
        CREATE TABLE approvals (
            id INTEGER PRIMARY KEY,
            release_id TEXT NOT NULL,
            spec_hash TEXT NOT NULL,
            approver TEXT NOT NULL,
            reason TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX approvals_release ON approvals(release_id, spec_hash);
        CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL,
            entry_count INTEGER NOT NULL,
            head_hash TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        -- seq is the chain position; entry_hash = SHA-256(previous entry_hash + canonical JSON of the row).
        CREATE TABLE chain (
            seq INTEGER PRIMARY KEY,
            table_name TEXT NOT NULL,
            row_id INTEGER NOT NULL,
            entry_hash TEXT NOT NULL,
            UNIQUE (table_name, row_id)
        );
        """
    )
    # The tables this migration created, frozen: later migrations protect their own tables.
    for table in AUDITED_TABLES[: AUDITED_TABLES.index("checkpoints") + 1] + ("chain",):
        _append_only(db, table)


def _append_only(db: sqlite_utils.Database, table: str) -> None:
    """The two triggers that refuse UPDATE and DELETE on an audited table (``chain.py`` checks them)."""
    db.executescript(
        f"""
        CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table}
        BEGIN SELECT RAISE(ABORT, 'audit table {table} is append-only: UPDATE refused'); END;
        CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}
        BEGIN SELECT RAISE(ABORT, 'audit table {table} is append-only: DELETE refused'); END;
        """
    )


@migrations(name="0002_release_failure_reason")
def _failure_reason(db: sqlite_utils.Database) -> None:
    """``releases.failure_reason``: why a release failed or was refused (check names, error class and message).

    Rows recorded before this migration keep their chain hash (see ``LATER_COLUMNS``); their reason, if
    any, is still in their manifest, which the officers' ``failures`` query reads as a fallback.
    """
    db.execute("ALTER TABLE releases ADD COLUMN failure_reason TEXT")


@migrations(name="0003_advice_events")
def _advice_events(db: sqlite_utils.Database) -> None:
    """``advice_events``: each run of the parameter advisor, a read of private data that spends no ε.

    Who asked, when, about which population, source (SHA-256) and spec (hash), over which grid of k and ε
    with how many Monte-Carlo draws, and where its private figures went. No figure of the advice itself:
    the advice is for the steward, and the store records that the data was read, not what it showed.
    Covered by the hash chain and append-only like every audited table.
    """
    db.executescript(
        """
        CREATE TABLE advice_events (
            id INTEGER PRIMARY KEY,
            population_id TEXT NOT NULL,
            spec_hash TEXT NOT NULL,
            source_sha256 TEXT NOT NULL,
            source_rows INTEGER NOT NULL,
            actor TEXT NOT NULL,
            via TEXT NOT NULL CHECK (via IN ('cli', 'flow')),
            flow_run_id TEXT,
            k_values TEXT NOT NULL,
            epsilon_values TEXT NOT NULL,
            draws INTEGER NOT NULL,
            report_dir TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX advice_events_population ON advice_events(population_id);
        CREATE INDEX advice_events_source ON advice_events(source_sha256);
        """
    )
    _append_only(db, "advice_events")


MAX_BUSY_TIMEOUT_S = 86_400


def busy_timeout_ms() -> int:
    """How long a write waits for another writer's lock: env KEPSILON_AUDIT_BUSY_TIMEOUT (seconds), else 60 s."""
    raw = settings.current().audit_busy_timeout
    if not raw:
        return BUSY_TIMEOUT_MS
    try:
        seconds = float(raw)
    except ValueError:
        raise SpecError(ENV_BUSY_TIMEOUT, "must be a number of seconds") from None
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise SpecError(ENV_BUSY_TIMEOUT, "must be a positive, finite number of seconds")
    if seconds > MAX_BUSY_TIMEOUT_S:  # SQLite takes the timeout as a C int of milliseconds
        raise SpecError(ENV_BUSY_TIMEOUT, f"must be at most {MAX_BUSY_TIMEOUT_S} seconds (one day)")
    return max(int(seconds * 1000), 1)


@migrations(name="0004_release_disclosure")
def _disclosure(db: sqlite_utils.Database) -> None:
    """What each release's published groups achieve on the sensitive columns, and its prosecutor risk.

    ``l_diversity_min``: fewest distinct sensitive values in a group; ``t_closeness_max``: largest EMD
    of a group to the whole table; ``homogeneous_groups``: groups with a single value of a sensitive
    column; ``prosecutor_risk``: 1/smallest group. Private figures (never in the public manifest).
    Rows recorded before this migration keep their chain hash (``LATER_COLUMNS``).
    """
    for column, kind in (
        ("l_diversity_min", "INTEGER"),
        ("t_closeness_max", "REAL"),
        ("homogeneous_groups", "INTEGER"),
        ("prosecutor_risk", "REAL"),
    ):
        db.execute(f"ALTER TABLE releases ADD COLUMN {column} {kind}")


@migrations(name="0005_ledger_delta")
def _ledger_delta(db: sqlite_utils.Database) -> None:
    """δ beside ε: the DP mode's releases are (ε, δ)-differentially private, and their δ compose too.

    ``ledger.atto_delta``: δ in integer units of 1e-18 (exact sums, like nano-ε), charged rounded up and
    capped rounded down. On a 'reserve' row (and its 'spend' and 'void' rows) it marks a DP-mode
    reservation, whose ε and δ add up in the population's DP total; NULL marks a release of the
    method's own mode, whose ε is bookkeeping and never enters that total. On a 'cap' row it is the
    population's lifetime δ cap (NULL: none). ``releases.privacy_model`` and ``releases.delta`` copy the
    record's mode and δ for the officers' queries. Rows chained before this migration keep their hash
    (``LATER_COLUMNS``).
    """
    db.execute("ALTER TABLE ledger ADD COLUMN atto_delta INTEGER CHECK (atto_delta IS NULL OR atto_delta > 0)")
    db.execute("ALTER TABLE releases ADD COLUMN privacy_model TEXT")
    db.execute("ALTER TABLE releases ADD COLUMN delta REAL")


@migrations(name="0006_principals")
def _principals(db: sqlite_utils.Database) -> None:
    """``principals`` (Ed25519 public keys, their holders' names and roles, added and revoked) and
    ``signatures`` (one per signed row: the act, the signer's key id, the signed payload and the
    signature). Both chained and append-only; ``principals.py`` says what they mean.
    """
    db.executescript(
        """
        CREATE TABLE principals (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            role TEXT CHECK (role IN ('steward', 'approver', 'officer', 'admin')),
            public_key TEXT NOT NULL,
            key_id TEXT NOT NULL,
            change TEXT NOT NULL CHECK (change IN ('add', 'revoke')),
            reason TEXT NOT NULL,
            created_at TEXT NOT NULL,
            CHECK ((change = 'add') = (role IS NOT NULL))
        );
        CREATE INDEX principals_key ON principals(key_id);
        CREATE TABLE signatures (
            id INTEGER PRIMARY KEY,
            act TEXT NOT NULL,
            table_name TEXT NOT NULL,
            row_id INTEGER NOT NULL,
            signer TEXT NOT NULL,
            key_id TEXT NOT NULL,
            payload TEXT NOT NULL,
            signature TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX signatures_row ON signatures(table_name, row_id);
        CREATE INDEX signatures_signature ON signatures(signature);
        """
    )
    _append_only(db, "principals")
    _append_only(db, "signatures")


def store_path(path: str | Path | None = None) -> Path:
    """The store's file: ``path``, else env KEPSILON_AUDIT_DB, else ./.kepsilon/audit.db.

    A store left at ./audit.db by an earlier version is refused by name rather than passed over: a fresh
    empty store in its place would forget every ε already spent.
    """
    if path is not None:
        return Path(path)
    configured = settings.current().audit_db
    if configured is not None:
        return configured
    if Path(LEGACY_PATH).exists():
        raise SpecError(
            ENV_PATH,
            f"an audit store is at ./{LEGACY_PATH}, where earlier versions kept it; move it and its "
            f"{LEGACY_PATH}.heads into ./{DEFAULT_FOLDER}/ (mode 0700), or point {ENV_PATH} at it",
        )
    return Path(DEFAULT_PATH)


def open_store(path: str | Path | None = None) -> sqlite_utils.Database:
    """Open (creating if needed) the audit store with WAL, foreign keys and a busy timeout; apply migrations.

    The store is private: its folder is created 0700 (an existing one that group or others can write to
    is refused, naming KEPSILON_AUDIT_DB), the file is created 0600 before SQLite opens it — SQLite gives
    its -wal and -shm the database file's mode, whatever the umask — and an older, wider store, -wal or
    -shm is narrowed to its owner.
    The WAL switch and the migrations run under an exclusive lock on ``<store>.lock``, with a retry on
    SQLITE_BUSY (switching a fresh file to WAL does not wait on SQLite's busy handler), so processes
    opening a fresh store together neither fail nor apply the schema twice.
    A store that cannot be opened (directory not creatable, read-only, corrupt, not a database) raises
    ``StoreUnavailable``. ``synchronous = FULL`` makes each commit durable before it returns, so a head
    logged after a commit can never be ahead of what survives a power cut.
    """
    target = store_path(path)
    _prepare_file(target)
    try:
        conn = sqlite3.connect(str(target), timeout=busy_timeout_ms() / 1000)
    except sqlite3.Error as error:
        raise unavailable(str(target), error, "open") from None
    db = sqlite_utils.Database(conn)
    try:
        db.execute(f"PRAGMA busy_timeout = {busy_timeout_ms()}")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("PRAGMA synchronous = FULL")
        with _setup_lock(target):
            _switch_to_wal(conn, str(target))
            if migrations.pending(db):
                with write_transaction(db):
                    migrations.apply(db)
        for companion in ("-wal", "-shm"):
            owner_only(str(target) + companion, ENV_PATH)
    except sqlite3.Error as error:
        conn.close()
        if sqlite_cause(error) is None:
            raise
        raise unavailable(str(target), error, "open") from None
    except BaseException:
        conn.close()
        raise
    return db


def _prepare_file(target: Path) -> None:
    """The store's folder checked (or created 0700) and its file created 0600 (or narrowed to its owner).

    A file that cannot be created (a read-only folder) is left to SQLite, whose refusal says so.
    """
    folder = target.parent
    if folder.exists():
        check_not_shared(folder, ENV_PATH)
    else:
        try:
            make_private_folder(folder)
        except OSError as error:
            raise StoreUnavailable(
                f"audit store {str(target)!r}: its directory cannot be created ({type(error).__name__})"
            ) from None
    try:
        create_private_file(target, ENV_PATH)
    except OSError:
        pass  # SQLite's own refusal follows, in the store's usual words
    for companion in ("-wal", "-shm"):
        owner_only(str(target) + companion, ENV_PATH)
    check_head_log_place(head_log_path(target))


@contextlib.contextmanager
def _setup_lock(target: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``<store>.lock`` (0600) for the WAL switch and the schema, waited for up to
    the busy timeout. Where the lock file cannot be created (read-only folder), the setup runs without it:
    the retry on SQLITE_BUSY and ``BEGIN IMMEDIATE`` still keep it safe, only less orderly."""
    lock_path = Path(str(target) + LOCK_SUFFIX)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + busy_timeout_ms() / 1000
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"audit store {str(target)!r} is being set up by another process: gave up after waiting "
                        f"{busy_timeout_ms() / 1000:.0f} s for {lock_path.name}; retry when it has finished"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _switch_to_wal(conn: sqlite3.Connection, store: str) -> None:
    """``journal_mode = WAL``, retried while SQLITE_BUSY: the switch needs the file to itself and, unlike a
    write, does not call SQLite's busy handler. Gives up after the busy timeout with ``StoreUnavailable``."""
    deadline = time.monotonic() + busy_timeout_ms() / 1000
    delay = 0.005
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
            if mode.lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if not _is_busy(error) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextlib.contextmanager
def write_transaction(db: sqlite_utils.Database) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction: the write lock is taken before anything is read.

    Committed on success, rolled back on any exception. Nested use is refused: a caller holding an
    open transaction would otherwise silently lose the atomicity this guarantees. A wait for the lock
    beyond ``LOCK_NOTICE_MS`` is logged (WARNING, logger ``kepsilon.audit``) with how long it will last;
    SQLite errors that are the store's fault become ``StoreUnavailable`` (nothing was written). After a
    commit that extended the chain, the new head is appended to the head log.
    """
    conn = db.conn
    if conn.in_transaction:
        raise RuntimeError("write_transaction cannot nest inside an open transaction")
    _begin_immediate(conn)
    try:
        before = _chain_tip(conn)
        yield conn
        after = _chain_tip(conn)
        conn.execute("COMMIT")
    except BaseException as error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the original error is the one to report
                conn.execute("ROLLBACK")
        if isinstance(error, sqlite3.Error) and sqlite_cause(error) is not None:
            raise unavailable(database_file(conn) or "(in memory)", error, "write to") from None
        raise
    if after != before and after is not None:
        _log_head(conn, *after)


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, saying so when the lock is not free within ``LOCK_NOTICE_MS``."""
    timeout = busy_timeout_ms()
    notice = min(LOCK_NOTICE_MS, timeout)
    started = time.monotonic()
    try:
        conn.execute(f"PRAGMA busy_timeout = {notice}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as error:
            if not _is_busy(error) or notice >= timeout:
                raise _lock_error(conn, error, started) from None
        left_ms = max(timeout - int((time.monotonic() - started) * 1000), 1)
        log.warning(
            "waiting for the audit store lock (%s is being written by another process); "
            "will wait up to %.0f s more",
            database_file(conn) or "the store",
            left_ms / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {left_ms}")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            raise _lock_error(conn, error, started) from None
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute(f"PRAGMA busy_timeout = {timeout}")


def _is_busy(error: sqlite3.Error) -> bool:
    name = getattr(error, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(error)


def _lock_error(conn: sqlite3.Connection, error: sqlite3.Error, started: float) -> Exception:
    store = database_file(conn) or "(in memory)"
    if not _is_busy(error):
        return unavailable(store, error, "write to") if sqlite_cause(error) else error
    waited = time.monotonic() - started
    return StoreUnavailable(
        f"audit store {store!r} is locked by another process: gave up after waiting {waited:.0f} s "
        f"({type(error).__name__} SQLITE_BUSY); nothing was written, retry when the other writer has finished"
    )


def _chain_tip(conn: sqlite3.Connection) -> tuple[int, str] | None:
    """(seq, hash) of the chain's last entry; None before the schema exists."""
    try:
        return conn.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    except sqlite3.OperationalError as error:
        if "no such table" in str(error):
            return None
        raise


def database_file(conn: sqlite3.Connection) -> str:
    """The main database's file name ('' for an in-memory or temporary database)."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main":
            return file or ""
    return ""


def _log_head(conn: sqlite3.Connection, entries: int, head_hash: str) -> None:
    """Append the committed head to the head log; a failure here is reported, not swallowed.

    The commit already happened, so the message says so: rerunning is safe (reservations, seeds and
    records are idempotent or append-only), and the log catches up with the next commit.
    """
    store = database_file(conn)
    if not store:
        return
    path = head_log_path(store)
    try:
        append_head(path, entries, head_hash, store)
    except OSError as error:
        raise StoreUnavailable(
            f"audit store {store!r}: the change was committed but {head_log_named(path)} could not be "
            f"written ({type(error).__name__}); make it writable (or set KEPSILON_AUDIT_HEAD_LOG) and rerun"
        ) from None


def now() -> str:
    """UTC timestamp as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``: sorts as text and compares with SQLite strftime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_json(value) -> str:
    """Deterministic JSON (sorted keys, no spaces, bytes as hex) used for hashing and stored manifests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def _json_default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"hex": bytes(value).hex()}
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot store a value of type {type(value).__name__} in the audit store")


def chain_hash(previous: str, content: str) -> str:
    """SHA-256 hex of the previous entry's hash followed by this entry's canonical content."""
    return hashlib.sha256((previous + content).encode("utf-8")).hexdigest()


GENESIS_HASH = "0" * 64


def _float_json(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


class _ValueJson(dict):
    """How json.dumps (as canonical_json calls it) writes each type SQLite returns, by type.

    Any other type falls back to canonical_json itself, which gives the same text because JSON encoding
    is compositional; a dict keeps the lookup in C, which matters at a million values.
    """

    def __missing__(self, kind):
        return canonical_json


_VALUE_JSON = _ValueJson({str: encode_basestring, int: int.__repr__, type(None): lambda _: "null", float: _float_json})


class RowEncoder:
    """Builds a row's chained content, ``canonical_json({"table": t, "row": {column: value}})``, fast.

    Byte-identical to that expression (tests check it) and about four times faster, so verifying
    100,000 entries stays well under a second: the column order and the key text are worked out once
    per table and compiled into one %-format expression (only positions go into the generated code,
    never names). Columns in ``LATER_COLUMNS`` are left out while NULL: a table with such columns gets
    two formats, one without them (all NULL) and one with them (all set), and only a row with some
    set and some NULL takes the general path.
    """

    def __init__(self, table: str, columns: list[str], offset: int = 0):
        """``columns`` are the row's column names; ``offset`` values precede them in each tuple (e.g. rowid)."""
        later = LATER_COLUMNS.get(table, frozenset())
        ordered = sorted(range(len(columns)), key=lambda i: columns[i])
        self._items = [(encode_basestring(columns[i]) + ":", i + offset, columns[i] in later) for i in ordered]
        self._suffix = "}," + '"table":' + encode_basestring(table) + "}"
        self._later = [i for _, i, drop in self._items if drop]
        if not self._later:
            self.content = self._compile(self._items)
            return
        # Two fixed formats: every later column NULL (left out), or every one set; a mix is general.
        self._without_later = self._compile([item for item in self._items if not item[2]])
        self._with_later = self._compile(self._items)
        self.content = self._by_later_columns
        if len(self._later) == 1:  # the ledger's δ: one test per row, on the verification's hot path
            (position,) = self._later
            without, with_later = self._without_later, self._with_later
            self.content = lambda values: without(values) if values[position] is None else with_later(values)

    def _compile(self, items) -> Callable:
        template = '{"row":{' + ",".join(key.replace("%", "%%") + "%s" for key, _, _ in items)
        template += self._suffix.replace("%", "%%")
        values = ", ".join(f"J[type(r[{i}])](r[{i}])" for _, i, _ in items)
        namespace: dict[str, Any] = {"T": template, "J": _VALUE_JSON}
        exec(f"def content(r):\n    return T % ({values},)\n", namespace)  # noqa: S102 - positions only
        return namespace["content"]

    def _by_later_columns(self, values) -> str:
        unset = sum(values[i] is None for i in self._later)
        if unset == len(self._later):
            return self._without_later(values)
        if unset == 0:
            return self._with_later(values)
        return self._general(values)

    def _general(self, values) -> str:
        to_json = _VALUE_JSON
        parts = [key + to_json[type(values[i])](values[i]) for key, i, drop in self._items if not (drop and values[i] is None)]
        return '{"row":{' + ",".join(parts) + self._suffix


def row_content(conn: sqlite3.Connection, table: str, row_id: int) -> str | None:
    """Canonical JSON of a stored row as the chain covers it, or None if the row is gone."""
    cursor = conn.execute(f"SELECT * FROM [{table}] WHERE rowid = ?", (row_id,))
    values = cursor.fetchone()
    if values is None:
        return None
    return _encoder(table, tuple(d[0] for d in cursor.description)).content(values)


@functools.lru_cache(maxsize=64)
def _encoder(table: str, columns: tuple[str, ...]) -> RowEncoder:
    """One encoder per table layout: ``append`` hashes every row it writes."""
    return RowEncoder(table, list(columns))


def append(conn: sqlite3.Connection, table: str, row: dict) -> int:
    """Insert ``row`` into an audited table and extend the hash chain over it; returns the rowid.

    Must run inside ``write_transaction`` so the chain head read here cannot change before the insert.
    The hashed content is the row as read back from SQLite, which is exactly what ``verify_chain``
    later recomputes from.
    """
    if table not in AUDITED_TABLES:
        raise ValueError(f"{table!r} is not an audited table")
    if not conn.in_transaction:
        raise RuntimeError("append must run inside write_transaction")
    columns = list(row)
    placeholders = ", ".join("?" for _ in columns)
    names = ", ".join(f"[{c}]" for c in columns)
    cursor = conn.execute(f"INSERT INTO [{table}] ({names}) VALUES ({placeholders})", [row[c] for c in columns])
    row_id = cursor.lastrowid
    content = row_content(conn, table, row_id) if row_id is not None else None
    if row_id is None or content is None:  # an INSERT sets lastrowid, and its row reads back in its transaction
        raise RuntimeError(f"the row just inserted into {table!r} cannot be read back")
    head = conn.execute("SELECT entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    previous = head[0] if head else GENESIS_HASH
    entry_hash = chain_hash(previous, content)
    conn.execute(
        "INSERT INTO chain (table_name, row_id, entry_hash) VALUES (?, ?, ?)", (table, row_id, entry_hash)
    )
    return row_id


def ensure_population(conn: sqlite3.Connection, population_id: str, actor: str) -> None:
    """Record the population on first use (inside the caller's write transaction)."""
    if not population_id or not isinstance(population_id, str):
        raise SpecError("population_id", "must be a non-empty string")
    exists = conn.execute("SELECT 1 FROM populations WHERE population_id = ?", (population_id,)).fetchone()
    if not exists:
        append(conn, "populations", {"population_id": population_id, "created_at": now(), "created_by": actor})


def require_text(parameter: str, value) -> str:
    """A non-empty, stripped string parameter, or a SpecError naming it."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(parameter, "must be a non-empty string")
    return value.strip()
