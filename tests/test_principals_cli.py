"""``kepsilon release --key`` in a store with principals, run as a user runs it (issue 26, items 3 and 5).

The short variant runs the real command three times against the session's Prefect server; the whole attack
scenario of ``make reliability`` (``reliability/identity.py``) is the heavy variant.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import release_spec_dict

pytestmark = pytest.mark.server
KEPSILON = str(Path(sys.executable).parent / "kepsilon")


def _cli(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([KEPSILON, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _ledger(store: Path) -> list[tuple]:
    import sqlite3

    conn = sqlite3.connect(store)
    try:
        return conn.execute("SELECT kind, actor FROM ledger ORDER BY id").fetchall()
    finally:
        conn.close()


def _signed_store(tmp_path: Path) -> dict[str, Path]:
    """Principals set up through the library (the CLI's own set-up is tests/test_principals.py's): root admin and
    officer, alice approver, bob steward; a cap of 5 signed by root. Returns the private key files."""
    from kepsilon.audit.ledger import cap_fields, set_cap
    from kepsilon.audit.principals import add_principal, init_admin, make_act
    from kepsilon.audit.signing import generate_key, key_id, load_private_key
    from kepsilon.audit.store import open_store

    keys = {name: tmp_path / "keys" / name for name in ("root", "alice", "bob")}
    public = {name: generate_key(path) for name, path in keys.items()}
    root = load_private_key(keys["root"], "--key")
    db = open_store(tmp_path / "store" / "audit.db")
    init_admin(db, root, "root")
    for name, role in (("alice", "approver"), ("bob", "steward"), ("root", "officer")):
        fields = {"change": "add", "name": name, "role": role, "key_id": key_id(public[name]), "reason": "team"}
        add_principal(db, make_act(db.conn, root, "principal", fields), name=name, role=role, public_key=public[name],
                      reason="team")
    set_cap(db, "cli-people", 5.0, None, "cap", signed=make_act(db.conn, root, "set-cap", cap_fields("cli-people", 5.0, "cap")))
    db.close()
    return keys


def test_a_release_without_the_stewards_key_or_naming_another_operator_is_refused_and_with_it_published(
    tmp_path, prefect_server_env
):
    env = {**prefect_server_env, "KEPSILON_AUDIT_DB": str(tmp_path / "store" / "audit.db"),
           "KEPSILON_SEED_KEY_FILE": str(tmp_path / "store" / "seed.key"), "KEPSILON_REPORTS_DIR": str(tmp_path / "reports"),
           "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}  # the head log the set-up below wrote, found by the CLI too
    for name in ("KEPSILON_SEED_KEY", "KEPSILON_DEFAULT_CAP", "KEPSILON_FAULT_AT", "KEPSILON_SIGNING_KEY"):
        env.pop(name, None)
    keys = _signed_store(tmp_path)
    spec = release_spec_dict("paper-synthetic", release_id="signed-1", population_id="cli-people",
                             output_dir=str(tmp_path / "out"), approval_required=True)
    spec.pop("operator", None)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    from kepsilon.flows.spec import load_spec

    spec_hash = load_spec(tmp_path / "spec.yaml").spec_hash()
    approved = _cli("audit", "approve", "signed-1", "--spec-hash", spec_hash, "--reason", "reviewed", "--key", str(keys["alice"]),
                    env=env, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    store = tmp_path / "store" / "audit.db"
    before = _ledger(store)

    unsigned = _cli("release", str(tmp_path / "spec.yaml"), env=env, cwd=tmp_path)
    assert unsigned.returncode == 2 and "requires signed releases" in unsigned.stderr and "Traceback" not in unsigned.stderr
    spoofed = _cli("release", str(tmp_path / "spec.yaml"), "--operator", "alice", "--key", str(keys["bob"]), env=env, cwd=tmp_path)
    assert spoofed.returncode == 2 and "'alice' is not the release's signer 'bob'" in spoofed.stderr
    assert _ledger(store) == before and not (tmp_path / "out" / "signed-1").exists()

    signed = _cli("release", str(tmp_path / "spec.yaml"), "--key", str(keys["bob"]), env=env, cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr[-2000:]
    assert [row for row in _ledger(store) if row not in before] == [("reserve", "bob"), ("spend", "kepsilon-flow")]
    assert (tmp_path / "out" / "signed-1" / "manifest.json").exists()
    verified = _cli("audit", "verify", "--format", "json", env=env, cwd=tmp_path)
    assert verified.returncode == 0 and "signature(s) verified" in verified.stdout


@pytest.mark.heavy
def test_every_identity_attack_of_make_reliability_is_refused(tmp_path, prefect_server_env):
    """``reliability/identity.py`` whole: about 20 CLI runs (several minutes on a loaded machine)."""
    from reliability.harness import Results
    from reliability.identity import CATEGORY, identity_scenario
    from reliability.scenarios import sample_source

    os.environ.setdefault("XDG_STATE_HOME", str(tmp_path / "state"))
    results = Results()
    identity_scenario(results, prefect_server_env, tmp_path / "identity", sample_source(tmp_path / "small.csv", 400))
    own = [c for c in results.checks if c.category == CATEGORY]
    assert len(own) >= 30 and not [f"{c.name}: {c.detail}" for c in own if not c.ok]
