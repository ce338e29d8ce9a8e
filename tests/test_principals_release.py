"""The operator authenticated (issue 26, item 3): a release in a store with principals is signed by a steward.

Every refusal is checked on the ledger: no reservation, no seed, nothing published.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from kepsilon.audit.approvals import ApprovalMissing, approval_fields, approve
from kepsilon.audit.errors import StoreCompromised
from kepsilon.audit.integrity import inspect_store
from kepsilon.audit.ledger import cap_fields, set_cap
from kepsilon.audit.principals import SignatureRefused, add_principal, init_admin, make_act
from kepsilon.audit.signing import key_id, public_key_text
from kepsilon.audit.store import open_store
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


class Team:
    """A signed store (root admin, alice approver, bob steward, olga officer) with a signed cap of 5 ε; each
    private key in a 0600 file of its own, as its holder would keep it."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.path = tmp_path / "store" / "audit.db"
        monkeypatch.setenv("KEPSILON_AUDIT_DB", str(self.path))
        monkeypatch.setenv("KEPSILON_SEED_KEY_FILE", str(tmp_path / "keys" / "seed.key"))
        monkeypatch.setenv("KEPSILON_REPORTS_DIR", str(tmp_path / "reports"))
        monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
        monkeypatch.delenv("KEPSILON_SIGNING_KEY", raising=False)
        self.monkeypatch = monkeypatch
        self.keys = {name: Ed25519PrivateKey.generate() for name in ("root", "alice", "bob", "olga")}
        self.files = {}
        folder = tmp_path / "holders"
        folder.mkdir(mode=0o700)
        for name, key in self.keys.items():
            path = folder / name
            path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
            path.chmod(0o600)
            self.files[name] = path
        self.db = open_store(self.path)
        init_admin(self.db, self.keys["root"], "root")
        for name, role in (("alice", "approver"), ("bob", "steward"), ("olga", "officer")):
            self.add(name, role)
        set_cap(self.db, "test-population", 5.0, None, "test cap",
                signed=make_act(self.db.conn, self.keys["olga"], "set-cap", cap_fields("test-population", 5.0, "test cap")))

    def add(self, name: str, role: str) -> None:
        public = public_key_text(self.keys[name].public_key())
        fields = {"change": "add", "name": name, "role": role, "key_id": key_id(public), "reason": "team"}
        add_principal(self.db, make_act(self.db.conn, self.keys["root"], "principal", fields), name=name, role=role,
                      public_key=public, reason="team")

    def run_as(self, name: str | None) -> None:
        """The process that runs the flow holds this person's key (env KEPSILON_SIGNING_KEY), or none."""
        if name is None:
            self.monkeypatch.delenv("KEPSILON_SIGNING_KEY", raising=False)
        else:
            self.monkeypatch.setenv("KEPSILON_SIGNING_KEY", str(self.files[name]))

    def approve(self, who: str, spec) -> None:
        fields = approval_fields(spec.release_id, spec.spec_hash(), "reviewed")
        approve(self.db, release_id=spec.release_id, spec_hash=spec.spec_hash(), approver=None, reason="reviewed",
                signed=make_act(self.db.conn, self.keys[who], "approve", fields))

    def spent(self) -> tuple[int, int, int]:
        """(reservations, sealed seeds, published records)."""
        one = self.db.conn.execute
        return (one("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0],
                one("SELECT COUNT(*) FROM sealed_seeds").fetchone()[0],
                one("SELECT COUNT(*) FROM releases WHERE outcome = 'published'").fetchone()[0])


@pytest.fixture
def team(tmp_path, monkeypatch):
    crew = Team(tmp_path, monkeypatch)
    yield crew
    crew.db.close()


def _spec(synthetic_spec_dict, **changes):
    return parse_spec({**synthetic_spec_dict, "approval_required": True, **changes})


def test_a_release_signed_by_the_steward_and_approved_by_another_key_is_published_and_verifies(team, synthetic_spec_dict):
    spec = _spec(synthetic_spec_dict)
    team.approve("alice", spec)
    team.run_as("bob")
    manifest = governed_release(spec)
    assert manifest["execution"]["operator"] == "bob" and manifest["approval"]["approver"] == "alice"
    signer = team.db.conn.execute(
        "SELECT s.signer FROM signatures s JOIN ledger l ON s.table_name = 'ledger' AND s.row_id = l.id WHERE l.kind = 'reserve'"
    ).fetchall()
    assert signer == [("bob",)] and team.spent() == (1, 1, 1)
    inspection = inspect_store(team.path)
    assert inspection.ok, inspection.problems


@pytest.mark.parametrize(
    ("runner", "operator", "refusal"),
    [
        (None, None, "requires signed releases"),
        ("bob", "carol", "'carol' is not the release's signer 'bob'"),  # spoofed through the spec or the run form
        ("alice", None, "holds no steward role"),
    ],
    ids=["no-key", "operator-spoofed", "approver-runs"],
)
def test_an_unauthenticated_or_spoofed_operator_is_refused_before_anything_is_read(team, synthetic_spec_dict, runner, operator, refusal):
    spec = _spec(synthetic_spec_dict, operator=operator)
    team.approve("alice", spec)
    team.run_as(runner)
    with pytest.raises(SignatureRefused, match=refusal):
        governed_release(spec)
    assert team.spent() == (0, 0, 0)
    assert not (Path(synthetic_spec_dict["output_dir"]) / "test-release").exists()
    # The store says why, for officers: one refused attempt, nobody authenticated as its operator.
    (recorded,) = team.db.conn.execute(
        "SELECT release_id, outcome, operator, reservation_id, failure_reason FROM releases"
    ).fetchall()
    assert recorded[:4] == (spec.release_id, "refused", None, None) and refusal in recorded[4]
    assert recorded[4].startswith("SignatureRefused: ")
    inspection = inspect_store(team.path)
    assert inspection.ok, inspection.problems


def test_an_approval_by_the_operators_own_key_is_refused_and_nothing_reserved(team, synthetic_spec_dict):
    team.add("bob", "approver")
    spec = _spec(synthetic_spec_dict)
    team.approve("bob", spec)
    team.run_as("bob")
    with pytest.raises(ApprovalMissing, match="own operator's key"):
        governed_release(spec)
    assert team.spent() == (0, 0, 0)


def test_a_forged_approval_written_into_the_file_is_caught_before_the_reservation(team, synthetic_spec_dict):
    from kepsilon.audit.store import append, canonical_json, now, write_transaction

    spec = _spec(synthetic_spec_dict)
    payload = {**approval_fields(spec.release_id, spec.spec_hash(), "reviewed"), "act": "approve",
               "store": make_act(team.db.conn, team.keys["olga"], "checkpoint", {}).payload["store"], "by": "alice", "at": now()}
    with write_transaction(team.db) as conn:  # the store's own writer: chained and head-logged, as a careful forger would
        row = append(conn, "approvals", {"release_id": spec.release_id, "spec_hash": spec.spec_hash(), "approver": "alice",
                                         "reason": "reviewed", "created_at": now()})
        append(conn, "signatures", {"act": "approve", "table_name": "approvals", "row_id": row, "signer": "alice",
                                    "key_id": key_id(public_key_text(team.keys["alice"].public_key())),
                                    "payload": canonical_json(payload), "signature": "A" * 86 + "==", "created_at": now()})
    team.run_as("bob")
    with pytest.raises(StoreCompromised, match="signature"):
        governed_release(spec)
    assert team.spent() == (0, 0, 0)


def test_kepsilon_check_names_the_operator_it_would_need_and_the_approval_it_finds(team, synthetic_spec_dict):
    from kepsilon.flows.check import check_release

    spec = _spec(synthetic_spec_dict)
    team.approve("alice", spec)
    team.run_as(None)
    verdicts = {v["name"]: v for v in check_release(spec, via="cli")["verdicts"]}
    assert not verdicts["operator"]["success"] and "requires signed releases" in verdicts["operator"]["detail"]
    team.run_as("bob")
    verdicts = {v["name"]: v for v in check_release(spec, via="cli")["verdicts"]}
    assert verdicts["operator"]["success"] and verdicts["approval"]["success"]
    assert team.spent() == (0, 0, 0)


@pytest.mark.heavy
def test_the_dask_engine_authenticates_its_operator_the_same_way(team, synthetic_spec_dict, tmp_path):
    """The partitioned path (flows/release_dask.py): refused without the steward's key, signed with it."""
    from kepsilon.flows.release_dask import governed_release_dask

    spec = _spec(synthetic_spec_dict, execution={"engine": "dask", "workers": 1, "partitions": 2,
                                                  "scratch": str(tmp_path / "scratch")})
    team.approve("alice", spec)
    team.run_as(None)
    with pytest.raises(SignatureRefused, match="requires signed releases"):
        governed_release_dask(spec)
    assert team.spent() == (0, 0, 0)
    team.run_as("bob")
    manifest = governed_release_dask(spec)
    assert manifest["execution"]["operator"] == "bob" and team.spent()[0] == 1
    assert inspect_store(team.path).ok
