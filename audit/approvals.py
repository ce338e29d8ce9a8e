"""Approvals: the two-person rule, bound to the exact spec a release runs with.

In a store with principals (``principals.py``) an approval is an approver's signature over the release
id, the spec hash and the reason; the rule then compares keys: the approving key must not be one of the
operator's (the operator being the authenticated signer of the release), and revoked keys no longer count.

An approval names a release id and a spec hash; a release with a changed spec (another k, ε, source…)
has another hash and needs a new approval. Names are compared case- and space-insensitively, so
"Alice" cannot approve a run by "alice ".
"""

from __future__ import annotations

import re

import sqlite_utils

from kepsilon.tasks.errors import KepsilonError, SpecError

from .principals import authorise, current_keys, is_signed, keys_of, record_signature
from .signing import SignedAct
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


def approval_fields(release_id: str, spec_hash: str, reason: str) -> dict:
    """What an approver signs: the release id, the exact spec hash and the reason (``principals.make_act``)."""
    return {"release_id": require_text("release_id", release_id), "spec_hash": _spec_hash(spec_hash),
            "reason": require_text("reason", reason)}


def approve(
    db: sqlite_utils.Database, *, release_id: str, spec_hash: str, approver: str | None, reason: str,
    signed: SignedAct | None = None,
) -> int:
    """Record an approval of ``release_id`` as specified by ``spec_hash``; returns the approval id.

    In a store with principals the approval must be ``signed`` by an approver's key over exactly these
    fields (``principals.authorise``), and the approver recorded is the key's holder; otherwise
    ``approver`` is the name given.
    """
    fields = approval_fields(release_id, spec_hash, reason)
    with write_transaction(db) as conn:
        authorised = authorise(conn, "approve", signed, fields, by=approver)
        name = authorised.name if authorised else require_text("approver", approver)
        row = append(conn, "approvals", {**fields, "approver": name, "created_at": now()})
        record_signature(conn, authorised, "approvals", row)
        return row


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
    if is_signed(db.conn):
        approvals = _signed_by_active_approvers(db.conn, approvals)
    matching = [a for a in approvals if a["spec_hash"] == spec_hash]
    operator_keys = set(keys_of(db.conn, operator)) if is_signed(db.conn) else set()
    independent = [
        a for a in matching if _person(a["approver"]) != _person(operator) and a.get("key_id") not in operator_keys
    ]
    if independent:
        return independent[0]
    if matching:
        problem = "it was approved only by its own operator (two-person rule)"
        if operator_keys:
            problem = "it was approved only with its own operator's key (two-person rule)"
    elif approvals:
        problem = f"approvals exist only for other spec hashes, not for {spec_hash[:12]}…"
    else:
        problem = "no approval is recorded"
    how = "--key FILE" if is_signed(db.conn) else "--by NAME"
    raise ApprovalMissing(
        f"release {release_id!r} needs an approval by someone other than its operator: {problem}; "
        f"record one with `kepsilon audit approve {release_id} --spec-hash {spec_hash} {how} --reason TEXT`"
    )


def _signed_by_active_approvers(conn, approvals: list[dict]) -> list[dict]:
    """In a signed store, only approvals signed by a key that still holds the approver role count: an
    approval recorded before the store had principals, or by a key revoked since (perhaps stolen), does not.
    Each kept approval gains its signer's ``key_id``."""
    signers = dict(conn.execute("SELECT row_id, key_id FROM signatures WHERE table_name = 'approvals'").fetchall())
    keys = current_keys(conn)
    kept = []
    for approval in approvals:
        kid = signers.get(approval["id"])
        state = keys.get(kid) if kid else None
        if state is not None and not state.revoked and "approver" in state.roles and state.name == approval["approver"]:
            kept.append({**approval, "key_id": kid})
    return kept
