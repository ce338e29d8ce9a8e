"""Principals: the people and services the store knows by their Ed25519 public keys, and their signed acts.

A store becomes *signed* when ``kepsilon audit init --admin NAME --key FILE`` registers its first admin
(``init_admin``): a ``principals`` row self-signed by that key, whose payload carries a fresh store id.
From then on every governed act must carry a signature (``signing.SignedAct``) by an active key of a
principal holding a role allowed for it (``ACT_ROLES``), and is refused otherwise — before anything is
written. The signature is kept in ``signatures`` (one row per signed row, naming its table and row id),
chained like every entry; ``check_signatures`` re-checks all of them for ``kepsilon audit verify`` and for
the integrity check a release runs before it reserves ε, so a signature forged into the file is caught.

A store without principals keeps working as before (names given with ``--by``), and ``verify`` says so:
its acts are attributed, not authenticated.

Roles: ``admin`` adds and revokes principals; ``approver`` approves releases (two-person rule);
``officer`` (or admin) sets caps, unseals seeds and signs checkpoints; ``steward`` runs releases — a
person at the CLI or the deployment's service principal whose key is in the worker's environment.
A key belongs to one name (so two keys compare as two people); a revoked key is never valid again.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NoReturn

from kepsilon.tasks.errors import KepsilonError, SpecError

from .signing import SignedAct, key_id, parse_public_key, sign, signature_valid
from .store import append, canonical_json, now, require_text, write_transaction

ROLES = ("steward", "approver", "officer", "admin")
# Who may sign each act, and the table its row goes to.
ACT_ROLES = {
    "principal": ("admin",),
    "approve": ("approver",),
    "set-cap": ("officer", "admin"),
    "unseal": ("officer", "admin"),
    "checkpoint": ("officer", "admin"),
    "release": ("steward",),
}
# How messages name each act.
ACT_NAMES = {"principal": "principal change", "approve": "approval", "set-cap": "cap", "unseal": "unseal",
             "checkpoint": "checkpoint", "release": "release"}
ACT_TABLE = {
    "principal": "principals",
    "approve": "approvals",
    "set-cap": "ledger",
    "unseal": "unseal_events",
    "checkpoint": "checkpoints",
    "release": "ledger",
}
# A signature older (or further in the future) than this when it reaches the store is refused: a captured
# signature cannot be kept and used later. Clocks of signer and store should agree within it.
FRESHNESS = timedelta(minutes=10)
# The flow's own unseal of an interrupted release's seed: covered by that release's signed reservation.
FLOW_ACTOR = "kepsilon-flow"
NO_PRINCIPALS = (
    "this audit store has no registered principals, so a signature cannot be checked; run "
    "`kepsilon audit init --admin NAME --key FILE` first, or leave out --key and unset KEPSILON_SIGNING_KEY"
)


class SignatureRefused(KepsilonError):
    """An act's signature is missing, invalid, by the wrong key or role, stale, replayed, or for another act."""


@dataclass
class KeyState:
    """One registered public key: its holder's name and the roles it currently holds."""

    name: str
    public_key: str
    roles: set[str] = field(default_factory=set)
    revoked: bool = False


@dataclass(frozen=True)
class Authorised:
    """A verified signature, ready to be recorded beside the row it covers."""

    act: SignedAct
    name: str


# --- reading the store's principals --------------------------------------------------------------------


def _has_tables(conn) -> bool:
    found = conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('signatures', 'principals')")
    return found.fetchone()[0] == 2


def store_id(conn) -> str | None:
    """The store's id, chosen by ``init_admin`` (None: the store has no principals, acts are not signed)."""
    if not _has_tables(conn):
        return None
    row = conn.execute("SELECT payload FROM signatures WHERE act = 'principal' ORDER BY id LIMIT 1").fetchone()
    if row is None:
        return None
    try:
        return str(json.loads(row[0])["store"])
    except (ValueError, KeyError, TypeError):
        return "(unreadable)"


def is_signed(conn) -> bool:
    """Whether the store has registered principals, so that every act must be signed."""
    return store_id(conn) is not None


def current_keys(conn) -> dict[str, KeyState]:
    """Every key ever registered, by key id, with the roles it holds now (revoked keys keep ``revoked``)."""
    keys: dict[str, KeyState] = {}
    if not _has_tables(conn):
        return keys
    for name, role, public_key, kid, change in conn.execute(
        "SELECT name, role, public_key, key_id, change FROM principals ORDER BY id"
    ):
        _apply(keys, name, role, public_key, kid, change)
    return keys


def _apply(keys: dict[str, KeyState], name: str, role: str | None, public_key: str, kid: str, change: str) -> None:
    state = keys.setdefault(kid, KeyState(name=name, public_key=public_key))
    if change == "add" and not state.revoked:
        assert role is not None  # the principals table's CHECK: an 'add' row always names its role
        state.roles.add(role)
    elif change == "revoke":
        state.revoked = True
        state.roles.clear()


def principal_rows(conn) -> list[dict]:
    """The principals as ``kepsilon audit principals`` lists them: one row per key, its roles and status."""
    keys = current_keys(conn)
    return [
        {"name": state.name, "key_id": kid, "roles": ",".join(sorted(state.roles)) or "-",
         "status": "revoked" if state.revoked else "active"}
        for kid, state in sorted(keys.items(), key=lambda item: (item[1].name, item[1].revoked, item[0]))
    ]


def principal_of(conn, public_key: str) -> KeyState | None:
    """The registered holder of ``public_key`` (None: not registered)."""
    return current_keys(conn).get(key_id(public_key))


# --- signing and checking acts ------------------------------------------------------------------------------


def make_act(conn, private_key, act: str, fields: dict, by: str | None = None) -> SignedAct:
    """Sign ``act`` with ``fields`` for this store, as the key's registered holder (``by``, if given, must be them).

    Refuses a key the store does not know, a revoked one, and a ``by`` naming someone else.
    """
    from .signing import public_key_text

    store = store_id(conn)
    if store is None:
        raise SignatureRefused(NO_PRINCIPALS)
    public = public_key_text(private_key.public_key())
    state = current_keys(conn).get(key_id(public))
    if state is None:
        raise SignatureRefused(f"the key {key_id(public)} is not registered in this audit store (`kepsilon audit principals`)")
    if by is not None and " ".join(by.split()) != state.name:
        raise SignatureRefused(f"the key {key_id(public)} belongs to {state.name!r}, not to {by!r}")
    payload = {**fields, "act": act, "store": store, "by": state.name, "at": now()}
    return sign(private_key, payload)


def authorise(conn, act: str, signed: SignedAct | None, fields: dict, by: str | None = None) -> Authorised | None:
    """Check a signed act against the store before its row is written; None for an unsigned store.

    In a signed store the act must be signed (``SignatureRefused`` otherwise) by an active key holding a
    role allowed for ``act``, over exactly ``fields`` for this store, recently, never used before; ``by``
    (the name the row will carry), if given, must be the key's holder. In a store without principals a
    signature is refused too: nobody could check it.
    """
    store = store_id(conn)
    if store is None:
        if signed is not None:
            raise SignatureRefused(NO_PRINCIPALS)
        return None
    if signed is None:
        raise SignatureRefused(
            f"this audit store requires signed acts: sign the {ACT_NAMES[act]} with your key "
            "(--key FILE or env KEPSILON_SIGNING_KEY; docs/identity.md)"
        )
    payload = signed.payload if isinstance(signed.payload, dict) else {}
    kid = key_id(signed.public_key)
    state = current_keys(conn).get(kid)
    if state is None:
        _refuse(f"the key {kid} is not registered in this audit store")
    _refuse_unless(not state.revoked, f"the key {kid} of {state.name!r} was revoked")
    _refuse_unless(bool(state.roles & set(ACT_ROLES[act])),
                   f"{state.name!r} holds no role allowed to sign a {ACT_NAMES[act]} ({' or '.join(ACT_ROLES[act])})")
    _refuse_unless(signature_valid(state.public_key, canonical_json(payload), signed.signature),
                   f"the signature of the {ACT_NAMES[act]} does not verify with {state.name!r}'s key {kid}")
    _refuse_unless(payload.get("act") == act, f"the signature is for a {payload.get('act')!r}, not a {ACT_NAMES[act]}")
    _refuse_unless(payload.get("store") == store, "the signature is for another audit store")
    _refuse_unless(payload.get("by") == state.name, f"the signature names {payload.get('by')!r}, not the key's holder")
    if by is not None:
        _refuse_unless(" ".join(str(by).split()) == state.name, f"the key {kid} belongs to {state.name!r}, not to {by!r}")
    for name, value in fields.items():
        _refuse_unless(payload.get(name) == value, f"the signature is for another {name.replace('_', ' ')}")
    _refuse_unless(_fresh(payload.get("at")), f"the signature's time is not within {FRESHNESS} of the store's clock")
    used = conn.execute("SELECT 1 FROM signatures WHERE signature = ?", (signed.signature,)).fetchone()
    _refuse_unless(used is None, "this signature was already used for another act (replay)")
    return Authorised(act=signed, name=state.name)


def _refuse_unless(condition: bool, problem: str) -> None:
    if not condition:
        _refuse(problem)


def _refuse(problem: str) -> NoReturn:
    raise SignatureRefused(f"signature refused: {problem}; nothing was recorded")


def _fresh(at) -> bool:
    try:
        when = datetime.strptime(str(at), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    return abs(datetime.now(UTC) - when) <= FRESHNESS


def record_signature(conn, authorised: Authorised | None, table: str, row_id: int) -> None:
    """Chain the verified signature beside the row it covers (inside the caller's write transaction)."""
    if authorised is None:
        return
    signed = authorised.act
    append(
        conn,
        "signatures",
        {
            "act": signed.payload["act"],
            "table_name": table,
            "row_id": row_id,
            "signer": authorised.name,
            "key_id": signed.key_id,
            "payload": canonical_json(signed.payload),
            "signature": signed.signature,
            "created_at": now(),
        },
    )


# --- managing principals ---------------------------------------------------------------------------------------


def _principal_fields(change: str, name: str, role: str | None, public_key: str, reason: str) -> dict:
    return {"change": change, "name": name, "role": role, "key_id": key_id(public_key), "reason": reason}


def init_admin(db, private_key, name: str, reason: str = "first admin") -> str:
    """Register the store's first admin, self-signed with ``private_key``: the store is signed from now on.

    Refused when the store already has principals. Returns the store's new id.
    """
    from .signing import public_key_text

    name = " ".join(require_text("admin", name).split())
    reason = require_text("reason", reason)
    public = public_key_text(private_key.public_key())
    with write_transaction(db) as conn:
        if store_id(conn) is not None:
            raise SignatureRefused("this audit store already has principals; an admin adds more with `kepsilon audit principal add`")
        new_id = uuid.uuid4().hex
        fields = _principal_fields("add", name, "admin", public, reason)
        signed = sign(private_key, {**fields, "act": "principal", "store": new_id, "by": name, "at": now()})
        row = append(conn, "principals", _principal_row(fields, public))
        record_signature(conn, Authorised(act=signed, name=name), "principals", row)
    return new_id


def _principal_row(fields: dict, public_key: str) -> dict:
    return {"name": fields["name"], "role": fields["role"], "public_key": public_key, "key_id": fields["key_id"],
            "change": fields["change"], "reason": fields["reason"], "created_at": now()}


def add_principal(db, signed: SignedAct, *, name: str, role: str, public_key: str, reason: str) -> int:
    """Register ``public_key`` for ``name`` with ``role``, signed by an admin. Returns the principals row id.

    A key already held by another name, or revoked, is refused: one key, one person, and a revoked key
    (perhaps stolen) never comes back.
    """
    name = " ".join(require_text("name", name).split())
    if role not in ROLES:
        raise SpecError("role", f"must be one of {', '.join(ROLES)}")
    public_key = parse_public_key(public_key, "public_key")
    reason = require_text("reason", reason)
    fields = _principal_fields("add", name, role, public_key, reason)
    with write_transaction(db) as conn:
        authorised = authorise(conn, "principal", signed, fields)
        if authorised is None:
            raise SignatureRefused("this audit store has no principals yet: `kepsilon audit init --admin NAME --key FILE` first")
        state = current_keys(conn).get(fields["key_id"])
        if state is not None and state.name != name:
            raise SignatureRefused(f"the key {fields['key_id']} is already registered to {state.name!r}; one key, one principal")
        if state is not None and state.revoked:
            raise SignatureRefused(f"the key {fields['key_id']} was revoked and cannot be registered again; make a new key")
        row = append(conn, "principals", _principal_row(fields, public_key))
        record_signature(conn, authorised, "principals", row)
    return row


def revoke_key(db, signed: SignedAct, *, name: str, public_key: str, reason: str) -> int:
    """Revoke one key of ``name`` (every role it held), signed by an admin. Returns the principals row id.

    The last active admin key cannot be revoked: nobody could change the principals afterwards.
    """
    name = " ".join(require_text("name", name).split())
    public_key = parse_public_key(public_key, "public_key")
    reason = require_text("reason", reason)
    fields = _principal_fields("revoke", name, None, public_key, reason)
    with write_transaction(db) as conn:
        authorised = authorise(conn, "principal", signed, fields)
        if authorised is None:
            raise SignatureRefused("this audit store has no principals to revoke")
        keys = current_keys(conn)
        state = keys.get(fields["key_id"])
        if state is None or state.name != name or state.revoked:
            raise SignatureRefused(f"{name!r} holds no active key {fields['key_id']}")
        admins = [kid for kid, other in keys.items() if "admin" in other.roles]
        if admins == [fields["key_id"]]:
            raise SignatureRefused("this is the last active admin key: add another admin before revoking it")
        row = append(conn, "principals", _principal_row(fields, public_key))
        record_signature(conn, authorised, "principals", row)
    return row


def keys_of(conn, name: str) -> dict[str, KeyState]:
    """Every key ever registered to ``name`` (active or revoked)."""
    name = " ".join(name.split())
    return {kid: state for kid, state in current_keys(conn).items() if state.name == name}


# --- verification of the whole store -----------------------------------------------------------------------------

# The rows of a signed store that must carry a signature: (table, SQL condition on the row, act).
_SIGNED_ROWS = (
    ("principals", "1", "principal"),
    ("approvals", "1", "approve"),
    ("ledger", "t.kind = 'cap'", "set-cap"),
    ("ledger", "t.kind = 'reserve'", "release"),
    ("unseal_events", f"t.actor <> '{FLOW_ACTOR}'", "unseal"),
    ("checkpoints", "1", "checkpoint"),
)


def check_signatures(conn) -> list[tuple[int, str]]:
    """Every problem with the store's signatures, by chain position; none for a store without principals.

    Re-checks each signature with the key registered *at its place in the chain* (added before it, not
    revoked before it), its signer's role, its payload against the row it covers and the store's id, and
    that every governed row chained after the first admin carries exactly one signature.
    """
    if not _has_tables(conn):
        return []
    problems: list[tuple[int, str]] = []
    events = conn.execute(
        """SELECT c.seq, 'signature', s.id, s.act, s.table_name, s.row_id, s.signer, s.key_id, s.payload, s.signature
             FROM signatures s JOIN chain c ON c.table_name = 'signatures' AND c.row_id = s.id
           UNION ALL
           SELECT c.seq, 'principal', p.id, p.change, p.name, p.role, p.public_key, p.key_id, NULL, NULL
             FROM principals p JOIN chain c ON c.table_name = 'principals' AND c.row_id = p.id
           ORDER BY 1"""
    ).fetchall()
    if not events:
        return []
    keys: dict[str, KeyState] = {}
    principal_rows_by_id = {event[2]: event for event in events if event[1] == "principal"}
    first_principal_seq = min((event[0] for event in events if event[1] == "principal"), default=None)
    store = None
    covered: dict[tuple[str, int], int] = {}
    for seq, kind, rid, act, table, row_id, signer, kid, payload_text, signature in events:
        if kind == "principal":
            continue
        where = f"chain entry {seq}: signature #{rid} ({act} of {table}#{row_id})"
        try:
            payload = json.loads(payload_text)
        except (TypeError, ValueError):
            payload = None
        if not isinstance(payload, dict):
            problems.append((seq, f"{where}: its payload is not a JSON object (altered)"))
            continue
        if store is None:
            store = payload.get("store")
        target = principal_rows_by_id.get(row_id) if table == "principals" else None
        first = table == "principals" and target is not None and target[0] == first_principal_seq and not keys
        state = keys.get(kid)
        if first and target is not None and target[7] == kid:  # the first admin signs its own registration
            state = KeyState(name=target[4], public_key=target[6], roles={"admin"})
        problem = _signature_problem(conn, act, table, row_id, signer, kid, payload, payload_text, signature, state, store)
        if problem is None and (table, row_id) in covered:
            problem = "a second signature for the same row"
        if problem is not None:
            problems.append((seq, f"{where}: {problem}"))
            continue
        covered[(table, row_id)] = seq
        if target is not None:
            _apply(keys, target[4], target[5], target[6], target[7], target[3])
    if first_principal_seq is None:
        return problems
    for table, condition, act in _SIGNED_ROWS:
        for seq, row_id in conn.execute(
            f"SELECT c.seq, t.rowid FROM [{table}] t JOIN chain c ON c.table_name = ? AND c.row_id = t.rowid "
            f"WHERE c.seq >= ? AND {condition}",
            (table, first_principal_seq),
        ):
            if (table, row_id) not in covered:
                problems.append((seq, f"chain entry {seq}: {table}#{row_id} ({act}) carries no valid signature, "
                                      "but the store requires signed acts"))
    return problems


def _signature_problem(conn, act, table, row_id, signer, kid, payload, payload_text, signature, state, store) -> str | None:
    """What is wrong with one stored signature (None: it verifies and matches its row)."""
    if act not in ACT_ROLES or ACT_TABLE[act] != table:
        return f"unknown act {act!r} for table {table!r}"
    if state is None:
        return f"signed by key {kid}, not registered at that point"
    if state.revoked:
        return f"signed by key {kid} of {state.name!r}, revoked before it"
    if not state.roles & set(ACT_ROLES[act]):
        return f"{state.name!r} held no role allowed to sign a {act} at that point"
    if payload_text != canonical_json(payload) or not signature_valid(state.public_key, payload_text, signature):
        return f"the signature does not verify with {state.name!r}'s key {kid} (forged or altered)"
    if payload.get("act") != act or payload.get("store") != store or payload.get("by") != state.name or signer != state.name:
        return "its payload names another act, store or signer"
    row = conn.execute(f"SELECT * FROM [{table}] WHERE rowid = ?", (row_id,))
    names = [d[0] for d in row.description]
    values = row.fetchone()
    if values is None:
        return "the row it signs is missing"
    mismatch = _row_mismatch(act, dict(zip(names, values)), payload, state.name)
    return f"the row does not match what was signed ({mismatch})" if mismatch else None


def _row_mismatch(act: str, row: dict, payload: dict, name: str) -> str | None:
    """The first field where the signed payload and the stored row disagree."""
    expected = {
        "principal": {"change": row.get("change"), "name": row.get("name"), "role": row.get("role"),
                      "key_id": row.get("key_id"), "reason": row.get("reason")},
        "approve": {"release_id": row.get("release_id"), "spec_hash": row.get("spec_hash"), "reason": row.get("reason")},
        "set-cap": {"population_id": row.get("population_id"), "nano_epsilon": row.get("nano_epsilon"),
                    "reason": row.get("reason")},
        "release": {"population_id": row.get("population_id"), "release_id": row.get("release_id"),
                    "idempotency_key": row.get("idempotency_key"), "nano_epsilon": row.get("nano_epsilon"),
                    "atto_delta": row.get("atto_delta")},
        "unseal": {"reason": row.get("reason")},
        "checkpoint": {"entry_count": row.get("entry_count"), "head_hash": row.get("head_hash")},
    }[act]
    for field_name, value in expected.items():
        if payload.get(field_name) != value:
            return field_name
    if act == "principal" and key_id_of_row(row) != row.get("key_id"):
        return "public_key"
    if act == "set-cap" and payload.get("atto_delta") is not None and payload["atto_delta"] != row.get("atto_delta"):
        return "atto_delta"
    if act == "unseal":
        for field_name in ("release_id", "idempotency_key"):
            if payload.get(field_name) is not None and payload[field_name] != row.get(field_name):
                return field_name
    actor = {"approve": "approver", "set-cap": "actor", "release": "actor", "unseal": "actor"}.get(act)
    if actor is not None and row.get(actor) != name:
        return actor
    return None


def key_id_of_row(row: dict) -> str | None:
    try:
        return key_id(row["public_key"])
    except (KeyError, IndexError, ValueError, TypeError):
        return None


def checkpoint_signature_problem(conn, data: dict) -> str | None:
    """What is wrong with an exported checkpoint file's signature (None: fine, or a store without principals).

    In a store with principals a checkpoint file must carry the signature ``write_checkpoint`` put in it:
    by a key that held the officer or admin role in this store (now or before its revocation), over this
    store's id and exactly the file's entry count and head hash.
    """
    store = store_id(conn)
    if store is None:
        return None
    signature = data.get("signature")
    if not isinstance(signature, dict):
        return "not signed, but this store has principals (a checkpoint file anyone could have written)"
    payload, public_key, text = signature.get("payload"), signature.get("public_key"), signature.get("signature")
    if not isinstance(payload, dict) or not isinstance(public_key, str) or not isinstance(text, str):
        return "its signature is malformed"
    try:
        kid = key_id(public_key)
    except (IndexError, ValueError):
        return "its signature is malformed"
    held = {role for (role,) in conn.execute("SELECT role FROM principals WHERE key_id = ? AND change = 'add'", (kid,))}
    if not held & set(ACT_ROLES["checkpoint"]):
        return f"signed by key {kid}, which never was an officer's or admin's in this store"
    registered = conn.execute("SELECT public_key FROM principals WHERE key_id = ? LIMIT 1", (kid,)).fetchone()[0]
    if not signature_valid(registered, canonical_json(payload), text):
        return "its signature does not verify (forged or altered)"
    if payload.get("act") != "checkpoint" or payload.get("store") != store:
        return "its signature is for another act or another store"
    if payload.get("entry_count") != data.get("entry_count") or payload.get("head_hash") != data.get("head_hash"):
        return "its entry count or head hash is not the one signed (altered)"
    return None
