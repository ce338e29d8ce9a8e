"""Sealed seeds: encrypted under a key outside the store, commitment in clear, every unseal recorded."""

import hashlib
import os
import stat

import numpy as np
import pytest
from cryptography.fernet import Fernet

from kepsilon.audit.ledger import mark_noise_drawn, remaining, reserve, set_cap
from kepsilon.audit.seeds import (
    SeedConflict,
    SeedIntegrityError,
    SeedNotFound,
    find_sealed_seed,
    seal_seed,
    seed_commitment,
    unseal_seed,
)
from kepsilon.audit.store import open_store
from kepsilon.tasks.errors import SpecError


@pytest.fixture(autouse=True)
def _key_in_tmp(tmp_path, monkeypatch):
    monkeypatch.delenv("KEPSILON_SEED_KEY", raising=False)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "keys" / "seed.key"))


@pytest.fixture
def db(tmp_path):
    store = open_store(tmp_path / "audit.db")
    yield store
    store.close()


SEED = bytes(range(32))


def test_commitment_is_sha256_and_short_seeds_are_refused():
    assert seed_commitment(SEED) == hashlib.sha256(SEED).hexdigest()
    with pytest.raises(SpecError, match="parameter 'seed'.*16"):
        seed_commitment(b"short")
    with pytest.raises(SpecError, match="parameter 'seed'.*bytes"):
        seed_commitment("not bytes" * 4)


def test_seal_stores_only_ciphertext_and_creates_a_private_key_file(db, tmp_path):
    commitment = seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    assert commitment == hashlib.sha256(SEED).hexdigest()
    key_file = tmp_path / "keys" / "seed.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    ciphertext, stored_commitment = db.execute("SELECT ciphertext, commitment FROM sealed_seeds").fetchone()
    assert stored_commitment == commitment
    assert SEED not in ciphertext and SEED.hex().encode() not in ciphertext
    assert Fernet(key_file.read_bytes()).decrypt(ciphertext) == SEED
    raw_file = (tmp_path / "audit.db").read_bytes() + (tmp_path / "audit.db-wal").read_bytes()
    assert SEED not in raw_file and SEED.hex().encode() not in raw_file


def test_find_and_unseal_record_who_why_and_verify(db):
    assert find_sealed_seed(db, "key-1") is None
    commitment = seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    assert find_sealed_seed(db, "key-1") == commitment
    assert unseal_seed(db, release_id="rel", by="carol", reason="court order 12") == SEED
    events = db.execute("SELECT release_id, idempotency_key, actor, reason, verified FROM unseal_events").fetchall()
    assert events == [("rel", "key-1", "carol", "court order 12", 1)]
    with pytest.raises(SpecError, match="'reason'"):
        unseal_seed(db, idempotency_key="key-1", by="carol", reason="")
    with pytest.raises(SeedNotFound):
        unseal_seed(db, release_id="other", by="carol", reason="x")


def test_resealing_same_seed_is_a_noop_and_another_seed_conflicts(db):
    seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    with pytest.raises(SeedConflict) as conflict:
        seal_seed(db, idempotency_key="key-1", release_id="rel", seed=os.urandom(32))
    assert SEED.hex() not in str(conflict.value)
    assert db.execute("SELECT COUNT(*) FROM sealed_seeds").fetchone()[0] == 1


def test_wrong_key_fails_integrity_and_the_attempt_is_still_recorded(db, monkeypatch):
    seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    monkeypatch.setenv("KEPSILON_SEED_KEY", Fernet.generate_key().decode())
    with pytest.raises(SeedIntegrityError):
        unseal_seed(db, idempotency_key="key-1", by="mallory", reason="curious")
    assert db.execute("SELECT actor, verified FROM unseal_events").fetchall() == [("mallory", 0)]
    monkeypatch.setenv("KEPSILON_SEED_KEY", "not-a-key")
    with pytest.raises(SpecError, match="KEPSILON_SEED_KEY.*Fernet") as bad:
        unseal_seed(db, idempotency_key="key-1", by="mallory", reason="curious")
    assert "not-a-key" not in str(bad.value)


def test_several_seeds_for_one_release_need_the_idempotency_key(db):
    seal_seed(db, idempotency_key="key-1", release_id="rel", seed=SEED)
    seal_seed(db, idempotency_key="key-2", release_id="rel", seed=bytes(reversed(SEED)))
    with pytest.raises(SeedNotFound, match="idempotency key"):
        unseal_seed(db, release_id="rel", by="carol", reason="x")
    assert unseal_seed(db, release_id="rel", idempotency_key="key-2", by="carol", reason="x") == bytes(reversed(SEED))


def _noise(seed: bytes) -> np.ndarray:
    return np.random.default_rng(np.frombuffer(seed, dtype=np.uint32)).laplace(0.0, 1.0, 100)


def test_crash_recovery_contract_rerun_rederives_identical_noise_and_spends_nothing(db):
    """Seal, reserve, mark noise, crash; the rerun reuses reservation and seed, so noise and ε are unchanged."""
    set_cap(db, "pop", 1.0, "alice", "initial")
    seed = os.urandom(32)
    seal_seed(db, idempotency_key="logical-1", release_id="rel", seed=seed)
    first = reserve(db, population_id="pop", epsilon=0.5, idempotency_key="logical-1", release_id="rel", operator="op")
    mark_noise_drawn(db, first.id)
    noise_before_crash = _noise(seed)
    # --- crash; the rerun starts without the seed in memory ---
    rerun = reserve(db, population_id="pop", epsilon=0.5, idempotency_key="logical-1", release_id="rel", operator="op")
    assert rerun.reused and rerun.id == first.id and rerun.status == "spent"
    assert find_sealed_seed(db, "logical-1") == seed_commitment(seed)
    recovered = unseal_seed(db, idempotency_key="logical-1", by="kepsilon-flow", reason="rerun of interrupted release")
    mark_noise_drawn(db, rerun.id)
    np.testing.assert_array_equal(_noise(recovered), noise_before_crash)
    assert remaining(db, "pop") == pytest.approx(0.5)
    assert db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'spend'").fetchone()[0] == 1
