"""Approvals: the two-person rule, bound to the exact spec a release runs with.

An approval names a release id and a spec hash; a release with a changed spec (another k, ε, source…)
has another hash and needs a new approval. Names are compared case- and space-insensitively, so
"Alice" cannot approve a run by "alice ".
"""

from __future__ import annotations

import re

import sqlite_utils

from kepsilon.tasks.errors import KepsilonError, SpecError

from .store import append, now, require_text, write_transaction

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ApprovalMissing(KepsilonError):
    """No approval by a second person exists for this release and spec hash; the release must not run."""


def _person(name: str) -> str:
    return " ".join(name.split()).casefold()


def _spec_hash(value) -> str:
    if not isinstance(value, str) or not _SHA256.match(value.strip().lower()):
        raise SpecError("spec_hash", "must be a SHA-256 hex digest (64 hex characters)")
    return value.strip().lower()


def approve(db: sqlite_utils.Database, *, release_id: str, spec_hash: str, approver: str, reason: str) -> int:
    """Record an approval of ``release_id`` as specified by ``spec_hash``; returns the approval id."""
    release_id = require_text("release_id", release_id)
    spec_hash = _spec_hash(spec_hash)
    approver = require_text("approver", approver)
    reason = require_text("reason", reason)
    with write_transaction(db) as conn:
        return append(
            conn,
            "approvals",
            {"release_id": release_id, "spec_hash": spec_hash, "approver": approver, "reason": reason, "created_at": now()},
        )


def require_approval(db: sqlite_utils.Database, *, release_id: str, spec_hash: str, operator: str) -> dict:
    """The latest approval of this release and spec hash by someone other than the operator.

    Raises ``ApprovalMissing`` otherwise, saying whether approvals exist only by the operator or only
    for other spec hashes (the message names no data, only ids and hash prefixes).
    """
    release_id = require_text("release_id", release_id)
    spec_hash = _spec_hash(spec_hash)
    operator = require_text("operator", operator)
    cursor = db.conn.execute(
        "SELECT id, release_id, spec_hash, approver, reason, created_at FROM approvals WHERE release_id = ? ORDER BY id DESC",
        (release_id,),
    )
    columns = [d[0] for d in cursor.description]
    approvals = [dict(zip(columns, row)) for row in cursor]
    matching = [a for a in approvals if a["spec_hash"] == spec_hash]
    independent = [a for a in matching if _person(a["approver"]) != _person(operator)]
    if independent:
        return independent[0]
    if matching:
        problem = "it was approved only by its own operator (two-person rule)"
    elif approvals:
        problem = f"approvals exist only for other spec hashes, not for {spec_hash[:12]}…"
    else:
        problem = "no approval is recorded"
    raise ApprovalMissing(
        f"release {release_id!r} needs an approval by someone other than its operator: {problem}; "
        f"record one with `kepsilon audit approve {release_id} --spec-hash {spec_hash} --by NAME --reason TEXT`"
    )
