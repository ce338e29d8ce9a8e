"""Sealed seeds: the noise seed of each release, kept only as Fernet ciphertext under a key held outside the store.

A stored seed plus the code strips the noise, so the store holds just the seed's SHA-256 commitment in
clear and its ciphertext; the key comes from env KEPSILON_SEED_KEY (a urlsafe-base64 Fernet key) or the
file named by KEPSILON_SEED_KEY_FILE (default ./.kepsilon/seed.key, created 0600 on first use).
Every unseal is recorded (who, why, when, whether the commitment verified) before the seed is returned.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import sqlite_utils
from cryptography.fernet import Fernet, InvalidToken

from kepsilon import settings
from kepsilon.tasks.errors import KepsilonError, SpecError

from .principals import FLOW_ACTOR, authorise, record_signature
from .private import DEFAULT_FOLDER, owner_only, private_folder, write_private_file
from .signing import SignedAct
from .store import append, now, require_text, write_transaction

ENV_KEY = "KEPSILON_SEED_KEY"
ENV_KEY_FILE = "KEPSILON_SEED_KEY_FILE"
DEFAULT_KEY_FILE = DEFAULT_FOLDER / "seed.key"
# A commitment in clear lets anyone brute-force a short seed; 128 bits make that infeasible.
MIN_SEED_BYTES = 16


class SeedConflict(KepsilonError):
    """A different seed is already sealed for the same logical release: a rerun must reuse the sealed one."""


class SeedNotFound(KepsilonError):
    """No sealed seed matches the request (or several do and the request must name the idempotency key)."""


class SeedIntegrityError(KepsilonError):
    """The decrypted seed does not match its commitment, or the key cannot decrypt it."""


def seed_commitment(seed: bytes) -> str:
    """SHA-256 hex of the seed: published in clear so a later unseal can prove the seed is the one used."""
    _check_seed(seed)
    return hashlib.sha256(bytes(seed)).hexdigest()


def _check_seed(seed) -> None:
    if not isinstance(seed, (bytes, bytearray)):
        raise SpecError("seed", "must be bytes")
    if len(seed) < MIN_SEED_BYTES:
        raise SpecError("seed", f"must be at least {MIN_SEED_BYTES} random bytes (its commitment is public)")


def key_file_path() -> Path:
    """The key file: env KEPSILON_SEED_KEY_FILE or ./.kepsilon/seed.key."""
    return settings.current().seed_key_file or Path(DEFAULT_KEY_FILE)


def _load_key() -> bytes:
    """The Fernet key from env, else from the key file, creating that file (0600, folder 0700) on first use.

    A key file whose folder others can write to is refused (they could swap the key); an older, wider
    key file is narrowed to its owner.
    """
    raw: str | bytes | None = settings.current().seed_key
    source = ENV_KEY
    if not raw:
        path = key_file_path()
        source = ENV_KEY_FILE
        private_folder(path.parent, ENV_KEY_FILE)
        if not path.exists():
            write_private_file(path, Fernet.generate_key(), ENV_KEY_FILE)
        owner_only(path, ENV_KEY_FILE)
        raw = path.read_bytes().strip()
    key = raw.encode() if isinstance(raw, str) else raw
    try:
        Fernet(key)
    except (ValueError, TypeError):
        raise SpecError(source, "is not a valid urlsafe-base64 Fernet key") from None
    return key


def _fingerprint(key: bytes) -> str:
    """Identifies which key sealed a seed without revealing it (a hash of a 256-bit random key)."""
    return hashlib.sha256(b"kepsilon-seed-key:" + key).hexdigest()[:16]


def seal_seed(db: sqlite_utils.Database, *, idempotency_key: str, release_id: str, seed: bytes) -> str:
    """Encrypt and store the seed of one logical release; returns its commitment.

    Sealing the same seed again for the same key is a no-op (a rerun); a different seed for a key
    that already has one raises ``SeedConflict`` — the rerun must unseal and reuse the original.
    """
    idempotency_key = require_text("idempotency_key", idempotency_key)
    release_id = require_text("release_id", release_id)
    commitment = seed_commitment(seed)
    key = _load_key()
    ciphertext = Fernet(key).encrypt(bytes(seed))
    with write_transaction(db) as conn:
        existing = conn.execute(
            "SELECT commitment FROM sealed_seeds WHERE idempotency_key = ?", (idempotency_key,)
        ).fetchone()
        if existing is not None:
            if existing[0] != commitment:
                raise SeedConflict(
                    "parameter 'idempotency_key': a different seed is already sealed for this release; "
                    "unseal and reuse it instead of drawing a new one"
                )
            return commitment
        append(
            conn,
            "sealed_seeds",
            {
                "idempotency_key": idempotency_key,
                "release_id": release_id,
                "commitment": commitment,
                "ciphertext": ciphertext,
                "key_fingerprint": _fingerprint(key),
                "created_at": now(),
            },
        )
    return commitment


def find_sealed_seed(db: sqlite_utils.Database, idempotency_key: str) -> str | None:
    """The commitment of the seed sealed for this logical release, or None if none was sealed."""
    row = db.conn.execute(
        "SELECT commitment FROM sealed_seeds WHERE idempotency_key = ?", (idempotency_key,)
    ).fetchone()
    return row[0] if row else None


def _locate(conn, idempotency_key: str | None, release_id: str | None):
    """The one sealed seed matching the given key and/or release id."""
    if idempotency_key is None and release_id is None:
        raise SpecError("idempotency_key", "give idempotency_key or release_id (or both)")
    rows = conn.execute(
        """SELECT id, idempotency_key, release_id, commitment, ciphertext FROM sealed_seeds
           WHERE (:key IS NULL OR idempotency_key = :key) AND (:release IS NULL OR release_id = :release)""",
        {"key": idempotency_key, "release": release_id},
    ).fetchall()
    if not rows:
        raise SeedNotFound("no sealed seed for that release")
    if len(rows) > 1:
        raise SeedNotFound(
            f"{len(rows)} seeds are sealed for release {release_id!r}; name the idempotency key to choose one"
        )
    return rows[0]


def unseal_fields(release_id: str | None, idempotency_key: str | None, reason: str) -> dict:
    """What an officer signs to unseal a seed (``principals.make_act``): the seed asked for and why."""
    return {"release_id": release_id, "idempotency_key": idempotency_key, "reason": require_text("reason", reason)}


def unseal_seed(
    db: sqlite_utils.Database, *, idempotency_key: str | None = None, release_id: str | None = None, by: str | None,
    reason: str, signed: SignedAct | None = None,
) -> bytes:
    """Decrypt a sealed seed, recording who, why and when first; verifies it against its commitment.

    The unseal event is committed even when verification fails (an attempt is worth auditing); then
    ``SeedIntegrityError`` is raised and no bytes are returned.
    """
    fields = unseal_fields(release_id, idempotency_key, reason)
    reason = fields["reason"]
    key = _load_key()
    with write_transaction(db) as conn:
        # The flow's own unseal (a rerun of an interrupted release) is covered by the release's signed reservation.
        authorised = None if by == FLOW_ACTOR and signed is None else authorise(conn, "unseal", signed, fields, by=by)
        by = authorised.name if authorised else require_text("by", by)
        sealed_id, key_found, release_found, commitment, ciphertext = _locate(conn, idempotency_key, release_id)
        try:
            seed = Fernet(key).decrypt(ciphertext)
            verified = hashlib.sha256(seed).hexdigest() == commitment
        except InvalidToken:
            seed, verified = None, False
        row = append(
            conn,
            "unseal_events",
            {
                "sealed_seed": sealed_id,
                "release_id": release_found,
                "idempotency_key": key_found,
                "actor": by,
                "reason": reason,
                "verified": int(verified),
                "created_at": now(),
            },
        )
        record_signature(conn, authorised, "unseal_events", row)
    if not verified:
        raise SeedIntegrityError(
            f"release {release_found!r}: the sealed seed cannot be decrypted with this key or fails its commitment"
        )
    assert seed is not None  # verified: it was decrypted
    return seed
