"""Errors of the audit store itself, as opposed to refusals the store makes (budget, approvals, seeds).

Both carry a one-line message meant for the operator's terminal and the Prefect UI: it names the
store, what is wrong and what to do, and never quotes a stored value (SQLite's own messages can, e.g.
"Could not decode to UTF-8 column … with text …", so they are reduced to their error class).
"""

from __future__ import annotations

import sqlite3

from kepsilon.tasks.errors import KepsilonError

VERIFY_HINT = "run `kepsilon audit verify` for the details"


class StoreError(KepsilonError):
    """The audit store cannot be used: base of ``StoreUnavailable`` and ``StoreCompromised``."""


class StoreUnavailable(StoreError):
    """The store could not be read or written right now (locked, read-only, full disk, corrupt file).

    Raised before or instead of a write, never after a partial one: SQLite rolled the transaction back,
    so nothing of the attempted change is in the store (except where the message says it committed).
    """


class StoreCompromised(StoreError):
    """The store is corrupt, tampered with or rolled back: nothing may be read from it or spent against it."""


# SQLite's primary result codes for "the store, not the caller, is the problem", with how to say so.
_CAUSES = {
    "SQLITE_BUSY": "is locked by another process",
    "SQLITE_LOCKED": "is locked by another connection",
    "SQLITE_READONLY": "is read-only (file, directory or mount)",
    "SQLITE_FULL": "cannot grow: the disk or file-size limit is full",
    "SQLITE_IOERR": "could not be read or written (I/O error)",
    "SQLITE_CORRUPT": "is corrupt",
    "SQLITE_NOTADB": "is not a database file (corrupt or overwritten)",
    "SQLITE_CANTOPEN": "cannot be opened (missing directory or no permission)",
    "SQLITE_PERM": "refused the access (permission)",
    "SQLITE_AUTH": "refused the access (authorisation)",
    "SQLITE_PROTOCOL": "is locked by another process (locking protocol)",
}
# Python raises this one itself, with the undecodable text in the message.
_UNDECODABLE = "Could not decode to UTF-8"


def sqlite_cause(error: BaseException) -> str | None:
    """What a SQLite error says about the store (e.g. "is read-only …"), or None if it is not a store problem.

    Constraint violations, programming errors and the append-only triggers' refusals are not store
    problems: they are left to propagate as they are.
    """
    if not isinstance(error, sqlite3.DatabaseError) or isinstance(
        error, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)
    ):
        return None
    if _UNDECODABLE in str(error):
        return "holds bytes that are not valid UTF-8 text (corrupt)"
    name = getattr(error, "sqlite_errorname", None) or ""
    primary = "_".join(name.split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
    if primary in _CAUSES:
        return _CAUSES[primary]
    message = str(error)
    for fragment, cause in (
        ("database is locked", _CAUSES["SQLITE_BUSY"]),
        ("readonly database", _CAUSES["SQLITE_READONLY"]),
        ("disk is full", _CAUSES["SQLITE_FULL"]),
        ("disk I/O error", _CAUSES["SQLITE_IOERR"]),
        ("malformed", _CAUSES["SQLITE_CORRUPT"]),
        ("not a database", _CAUSES["SQLITE_NOTADB"]),
        ("unable to open", _CAUSES["SQLITE_CANTOPEN"]),
    ):
        if fragment in message:
            return cause
    return None


def error_label(error: BaseException) -> str:
    """The error's class and SQLite code, e.g. ``OperationalError SQLITE_READONLY`` — never its message."""
    name = getattr(error, "sqlite_errorname", None)
    return f"{type(error).__name__} {name}" if name else type(error).__name__


def unavailable(store: str, error: BaseException, doing: str = "use") -> StoreUnavailable:
    """A ``StoreUnavailable`` for a SQLite error met while ``doing`` something with ``store``."""
    cause = sqlite_cause(error) or "failed"
    advice = "; " + VERIFY_HINT if "corrupt" in cause or "not a database" in cause else ""
    return StoreUnavailable(f"audit store {store!r} {cause}: could not {doing} it ({error_label(error)}){advice}")
