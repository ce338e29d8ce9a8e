"""Principals and signed acts (issue 26): who approves, caps, unseals and checkpoints is proven by a key.

Each attack of the issue is tried against a real store file: an approval with an unregistered key, with a
revoked key, with the operator's own key, replayed for another spec hash or release, and a forged signature
written straight into the SQLite file — each refused (or caught by the check a release runs before ε) with
nothing recorded.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kepsilon.audit.approvals import ApprovalMissing, approval_fields, approve, require_approval
from kepsilon.audit.chain import chain_head, write_checkpoint
from kepsilon.audit.errors import StoreCompromised
from kepsilon.audit.integrity import check_store, inspect_store
from kepsilon.audit.ledger import CapMissing, cap_fields, release_fields, reserve, set_cap
from kepsilon.audit.principals import (
    SignatureRefused,
    add_principal,
    current_keys,
    init_admin,
    is_signed,
    make_act,
    revoke_key,
)
from kepsilon.audit.signing import SignedAct, generate_key, load_private_key, public_key_text, sign
from kepsilon.audit.store import append, now, open_store, write_transaction

SPEC = "a" * 64
OTHER_SPEC = "b" * 64


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.delenv("KEPSILON_SIGNING_KEY", raising=False)
    monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
    monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "keys" / "seed.key"))


class People:
    """A signed store with an admin (root), an approver (alice), a steward (bob) and an officer (olga)."""

    def __init__(self, path: Path):
        self.path = path
        self.db = open_store(path)
        self.keys = {name: Ed25519PrivateKey.generate() for name in ("root", "alice", "bob", "olga", "eve")}
        init_admin(self.db, self.keys["root"], "root")
        for name, role in (("alice", "approver"), ("bob", "steward"), ("olga", "officer")):
            self.add(name, role)

    def add(self, name: str, role: str, key: Ed25519PrivateKey | None = None) -> None:
        public = public_key_text((key or self.keys[name]).public_key())
        fields = {"change": "add", "name": name, "role": role, "key_id": _kid(public), "reason": "hired"}
        add_principal(self.db, self.act("root", "principal", fields), name=name, role=role, public_key=public, reason="hired")

    def act(self, who: str, act: str, fields: dict) -> SignedAct:
        return make_act(self.db.conn, self.keys[who], act, fields)

    def approve(self, who: str, release: str = "R1", spec_hash: str = SPEC) -> int:
        signed = self.act(who, "approve", approval_fields(release, spec_hash, "reviewed"))
        return approve(self.db, release_id=release, spec_hash=spec_hash, approver=None, reason="reviewed", signed=signed)

    def counts(self) -> tuple[int, int, int]:
        """(approvals, ledger rows, chain entries): what an attack must leave unchanged."""
        one = self.db.conn.execute
        return (one("SELECT COUNT(*) FROM approvals").fetchone()[0], one("SELECT COUNT(*) FROM ledger").fetchone()[0],
                one("SELECT COUNT(*) FROM chain").fetchone()[0])


def _kid(public: str) -> str:
    from kepsilon.audit.signing import key_id

    return key_id(public)


@pytest.fixture
def people(tmp_path) -> Iterator[People]:
    team = People(tmp_path / "store" / "audit.db")
    yield team
    team.db.close()


def test_init_makes_the_store_signed_and_an_unsigned_approval_is_refused(people):
    assert is_signed(people.db.conn)
    assert {state.name: sorted(state.roles) for state in current_keys(people.db.conn).values()} == {
        "root": ["admin"], "alice": ["approver"], "bob": ["steward"], "olga": ["officer"]}
    before = people.counts()
    with pytest.raises(SignatureRefused, match="requires signed acts"):
        approve(people.db, release_id="R1", spec_hash=SPEC, approver="alice", reason="ok")
    assert people.counts() == before


def test_a_signed_approval_is_recorded_verified_and_satisfies_the_two_person_rule(people):
    entry = people.approve("alice")
    assert require_approval(people.db, release_id="R1", spec_hash=SPEC, operator="bob")["id"] == entry
    inspection = inspect_store(people.path)
    assert inspection.ok, inspection.problems
    assert inspection.signatures == "5 signature(s) verified"  # root, alice, bob, olga registered; one approval


def test_an_approval_with_an_unregistered_key_is_refused_and_nothing_recorded(people):
    before = people.counts()
    forged = sign(people.keys["eve"], {**approval_fields("R1", SPEC, "reviewed"), "act": "approve",
                                       "store": people.act("alice", "approve", {}).payload["store"], "by": "alice", "at": now()})
    with pytest.raises(SignatureRefused, match="not registered"):
        approve(people.db, release_id="R1", spec_hash=SPEC, approver=None, reason="reviewed", signed=forged)
    with pytest.raises(SignatureRefused, match="not registered"):
        people.act("eve", "approve", approval_fields("R1", SPEC, "reviewed"))
    assert people.counts() == before


def test_a_revoked_key_can_no_longer_approve_and_its_earlier_approval_stops_counting(people):
    people.approve("alice")
    public = public_key_text(people.keys["alice"].public_key())
    fields = {"change": "revoke", "name": "alice", "role": None, "key_id": _kid(public), "reason": "laptop stolen"}
    revoke_key(people.db, people.act("root", "principal", fields), name="alice", public_key=public, reason="laptop stolen")
    with pytest.raises(ApprovalMissing, match="no approval is recorded"):
        require_approval(people.db, release_id="R1", spec_hash=SPEC, operator="bob")
    before = people.counts()
    with pytest.raises(SignatureRefused, match="revoked"):
        approve(people.db, release_id="R1", spec_hash=SPEC, approver=None, reason="reviewed",
                signed=sign(people.keys["alice"], {**approval_fields("R1", SPEC, "reviewed"), "act": "approve",
                            "store": people.act("olga", "set-cap", {}).payload["store"], "by": "alice", "at": now()}))
    assert people.counts() == before
    with pytest.raises(SignatureRefused, match="revoked and cannot be registered again"):
        people.add("alice", "approver")
    assert inspect_store(people.path).ok


@pytest.mark.parametrize(
    ("release", "spec_hash", "problem"),
    [("R1", OTHER_SPEC, "another spec hash"), ("R2", SPEC, "another release id"), ("R1", SPEC, "already used")],
)
def test_a_replayed_approval_is_refused_for_another_spec_hash_another_release_or_again(people, release, spec_hash, problem):
    signed = people.act("alice", "approve", approval_fields("R1", SPEC, "reviewed"))
    approve(people.db, release_id="R1", spec_hash=SPEC, approver=None, reason="reviewed", signed=signed)
    before = people.counts()
    with pytest.raises(SignatureRefused, match=problem):
        approve(people.db, release_id=release, spec_hash=spec_hash, approver=None, reason="reviewed", signed=signed)
    assert people.counts() == before
    if (release, spec_hash) != ("R1", SPEC):
        with pytest.raises(ApprovalMissing):
            require_approval(people.db, release_id=release, spec_hash=spec_hash, operator="bob")


def test_an_approval_with_the_operators_own_key_does_not_satisfy_the_two_person_rule(people):
    people.add("bob", "approver")  # bob may approve others' releases, with the key he runs releases with
    people.approve("bob")
    with pytest.raises(ApprovalMissing, match="own operator's key"):
        require_approval(people.db, release_id="R1", spec_hash=SPEC, operator="bob")
    assert require_approval(people.db, release_id="R1", spec_hash=SPEC, operator="carol")["approver"] == "bob"


def test_only_the_roles_allowed_may_sign_and_a_stale_signature_is_refused(people):
    with pytest.raises(SignatureRefused, match="no role allowed to sign a approval"):
        people.approve("bob")
    with pytest.raises(SignatureRefused, match="no role allowed to sign a cap"):
        set_cap(people.db, "P", 2.0, None, "why", signed=people.act("alice", "set-cap", cap_fields("P", 2.0, "why")))
    stale = people.act("alice", "approve", approval_fields("R1", SPEC, "reviewed"))
    stale = sign(people.keys["alice"], {**stale.payload, "at": "2020-01-01T00:00:00.000000Z"})
    with pytest.raises(SignatureRefused, match="time is not within"):
        approve(people.db, release_id="R1", spec_hash=SPEC, approver=None, reason="reviewed", signed=stale)
    entry = set_cap(people.db, "P", 2.0, None, "why", signed=people.act("olga", "set-cap", cap_fields("P", 2.0, "why")))
    actor = people.db.conn.execute("SELECT actor FROM ledger WHERE id = ?", (entry,)).fetchone()[0]
    assert actor == "olga"


def test_the_last_admin_cannot_be_revoked_and_a_key_belongs_to_one_name(people):
    public = public_key_text(people.keys["root"].public_key())
    fields = {"change": "revoke", "name": "root", "role": None, "key_id": _kid(public), "reason": "leaving"}
    with pytest.raises(SignatureRefused, match="last active admin"):
        revoke_key(people.db, people.act("root", "principal", fields), name="root", public_key=public, reason="leaving")
    with pytest.raises(SignatureRefused, match="already registered to 'alice'"):
        people.add("mallory", "approver", key=people.keys["alice"])
    with pytest.raises(SignatureRefused, match="no role allowed to sign a principal change"):
        public_eve = public_key_text(people.keys["eve"].public_key())
        fields = {"change": "add", "name": "eve", "role": "admin", "key_id": _kid(public_eve), "reason": "x"}
        add_principal(people.db, people.act("alice", "principal", fields), name="eve", role="admin",
                      public_key=public_eve, reason="x")


def _forge_approval(people: People, signature: str | None) -> None:
    """Someone who can write the store file (not an approver's key) adds an approval the way the store would:
    chained, head logged; with a made-up signature row, or none."""
    store = people.act("olga", "checkpoint", {}).payload["store"]
    payload = {**approval_fields("R1", SPEC, "reviewed"), "act": "approve", "store": store, "by": "alice", "at": now()}
    from kepsilon.audit.store import canonical_json

    with write_transaction(people.db) as conn:
        row = append(conn, "approvals", {"release_id": "R1", "spec_hash": SPEC, "approver": "alice", "reason": "reviewed",
                                         "created_at": now()})
        if signature is not None:
            append(conn, "signatures", {"act": "approve", "table_name": "approvals", "row_id": row, "signer": "alice",
                                        "key_id": _kid(public_key_text(people.keys["alice"].public_key())),
                                        "payload": canonical_json(payload), "signature": signature, "created_at": now()})


@pytest.mark.parametrize("signature", ["A" * 86 + "==", None], ids=["forged-signature", "no-signature"])
def test_an_approval_written_straight_into_the_store_is_caught_before_epsilon(people, signature):
    _forge_approval(people, signature)
    with pytest.raises(StoreCompromised, match="signature"):
        check_store(people.path)
    problems = inspect_store(people.path).problems
    uncovered = "approvals#1 (approve) carries no valid signature"
    expected = ["does not verify with 'alice'", uncovered] if signature else [uncovered]
    assert len(problems) == len(expected) and all(any(e in p for p in problems) for e in expected)


def test_a_signed_checkpoint_file_is_verified_and_an_unsigned_or_altered_one_is_a_problem(people, tmp_path):
    count, head = chain_head(people.db)
    with pytest.raises(SignatureRefused, match="sign the checkpoint"):
        write_checkpoint(people.db, tmp_path / "unsigned.json")
    signed = people.act("olga", "checkpoint", {"entry_count": count, "head_hash": head})
    written = write_checkpoint(people.db, tmp_path / "head.json", signed=signed)
    assert written["signature"]["payload"]["by"] == "olga"
    assert inspect_store(people.path, checkpoint=tmp_path / "head.json").ok
    import json

    data = json.loads((tmp_path / "head.json").read_text())
    del data["signature"]
    (tmp_path / "bare.json").write_text(json.dumps(data))
    assert any("not signed" in p for p in inspect_store(people.path, checkpoint=tmp_path / "bare.json").problems)
    # The file the store recorded exporting, re-signed by someone without an officer's key: found on every check.
    forged = json.loads((tmp_path / "head.json").read_text())
    forged["signature"] = {**forged["signature"], "signature": sign(people.keys["eve"], forged["signature"]["payload"]).signature}
    (tmp_path / "head.json").write_text(json.dumps(forged))
    assert any("head.json" in p and "does not verify" in p for p in inspect_store(people.path).problems)


def test_an_officer_unseals_with_a_signature_and_the_flow_its_own_rerun_without(people):
    import os

    from kepsilon.audit.seeds import seal_seed, unseal_fields, unseal_seed

    seed = os.urandom(32)
    seal_seed(people.db, idempotency_key="key-1", release_id="R1", seed=seed)
    with pytest.raises(SignatureRefused, match="sign the unseal"):
        unseal_seed(people.db, release_id="R1", by="olga", reason="audit sample")
    signed = people.act("olga", "unseal", unseal_fields("R1", None, "audit sample"))
    assert unseal_seed(people.db, release_id="R1", by=None, reason="audit sample", signed=signed) == seed
    assert unseal_seed(people.db, idempotency_key="key-1", by="kepsilon-flow", reason="rerun of interrupted release") == seed
    actors = [row[0] for row in people.db.conn.execute("SELECT actor FROM unseal_events ORDER BY id")]
    assert actors == ["olga", "kepsilon-flow"] and inspect_store(people.path).ok


def test_a_store_without_principals_works_as_before_and_says_acts_are_not_authenticated(tmp_path):
    path = tmp_path / "plain" / "audit.db"
    db = open_store(path)
    set_cap(db, "P", 2.0, "officer", "why")
    approve(db, release_id="R1", spec_hash=SPEC, approver="carol", reason="ok")
    assert require_approval(db, release_id="R1", spec_hash=SPEC, operator="bob")["approver"] == "carol"
    inspection = inspect_store(path)
    assert inspection.ok and "not authenticated" in inspection.signatures
    with pytest.raises(SignatureRefused, match="no registered principals"):
        make_act(db.conn, Ed25519PrivateKey.generate(), "approve", approval_fields("R1", SPEC, "ok"))
    db.close()


def test_private_keys_others_can_read_or_that_are_not_ed25519_are_refused(tmp_path):
    from kepsilon.tasks.errors import SpecError

    folder = tmp_path / "keys"
    generate_key(folder / "me")
    assert oct((folder / "me").stat().st_mode & 0o777) == "0o600"
    load_private_key(folder / "me", "--key")
    (folder / "me").chmod(0o644)
    with pytest.raises(SpecError, match="can be read by others"):
        load_private_key(folder / "me", "--key")
    rsa = folder / "rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", str(rsa)], check=True)
    with pytest.raises(SpecError, match="not an Ed25519 key"):
        load_private_key(rsa, "--key")
    ssh = folder / "ssh"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh)], check=True)
    assert public_key_text(load_private_key(ssh, "--key").public_key()) == " ".join(
        (folder / "ssh.pub").read_text().split()[:2])


def _kepsilon(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI run in ``cwd``: `audit verify` reads ./out, which in the checkout may hold `make demo`'s releases."""
    return subprocess.run([str(Path(sys.executable).parent / "kepsilon"), *args], capture_output=True, text=True, env=env,
                          cwd=cwd)


def test_the_cli_sets_up_principals_and_signs_an_approval_as_the_docs_say(tmp_path):
    """docs/identity.md's walk-through, run as a user runs it: keygen, init, principal add, approve, verify."""
    import os

    env = {**os.environ, "KEPSILON_AUDIT_DB": str(tmp_path / "store" / "audit.db"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "COLUMNS": "200"}
    env.pop("KEPSILON_SIGNING_KEY", None)
    keys = tmp_path / "keys"
    for name in ("admin", "alice"):
        assert _kepsilon("audit", "keygen", str(keys / name), env=env, cwd=tmp_path).returncode == 0
    done = _kepsilon("audit", "init", "--admin", "root", "--key", str(keys / "admin"), env=env, cwd=tmp_path)
    assert done.returncode == 0 and "every approval" in done.stdout
    done = _kepsilon("audit", "principal", "add", "alice", "--role", "approver", "--public-key", str(keys / "alice.pub"),
                     "--reason", "officer on duty", "--key", str(keys / "admin"), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    refused = _kepsilon("audit", "approve", "R1", "--spec-hash", SPEC, "--by", "alice", "--reason", "ok", env=env, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "requires signed acts" in refused.stderr
    done = _kepsilon("audit", "approve", "R1", "--spec-hash", SPEC, "--reason", "ok", env={**env, "KEPSILON_SIGNING_KEY": str(keys / "alice")}, cwd=tmp_path)
    assert done.returncode == 0 and "signed by alice" in done.stdout
    spoof = _kepsilon("audit", "approve", "R1", "--spec-hash", SPEC, "--reason", "ok", "--by", "carol", "--key", str(keys / "alice"), env=env, cwd=tmp_path)
    assert spoof.returncode == 2 and "belongs to 'alice', not to 'carol'" in spoof.stderr
    verify = _kepsilon("audit", "verify", "--format", "json", env=env, cwd=tmp_path)
    assert verify.returncode == 0 and '"signatures": "3 signature(s) verified"' in verify.stdout


def test_a_signed_store_without_a_cap_refuses_a_reservation_with_cap_missing(people, monkeypatch):
    # A signed store takes caps only from an officer's signature, never from env KEPSILON_DEFAULT_CAP;
    # with none set, a signed reservation is refused as "no cap" (it once fell through to a TypeError).
    monkeypatch.setenv("KEPSILON_DEFAULT_CAP", "5")
    fields = release_fields("P", 1.0, "key-1", "R1", None, SPEC)
    before = people.counts()
    with pytest.raises(CapMissing):
        reserve(people.db, population_id="P", epsilon=1.0, idempotency_key="key-1", release_id="R1",
                operator="bob", spec_hash=SPEC, signed=people.act("bob", "release", fields))
    assert people.counts() == before
