"""``make serve`` refuses to start with a service key that could not sign a release (issue 26, item 3).

deployments/serve.sh, run as ``make serve`` runs it, over a store with principals (root admin, svc-prefect steward,
alice approver): a KEPSILON_SERVICE_KEY that is not registered, readable by others, or without the steward role
stops it with one line naming the setting, exit 2, before the server starts (no Prefect login generated, no server
log). Without a key it warns that the deployment's releases will be refused. The signed release through the UI
under a good key is tests/test_service_principal_ui.py (heavy).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from kepsilon.audit.principals import add_principal, init_admin, make_act
from kepsilon.audit.signing import key_id, public_key_text
from kepsilon.audit.store import open_store

from .conftest import ROOT

NAMES = ("root", "svc-prefect", "alice", "mallory")


@pytest.fixture
def team(tmp_path) -> dict:
    """A signed store (root admin, svc-prefect steward, alice approver; mallory never registered) and each key's file."""
    holders = tmp_path / "holders"
    holders.mkdir(mode=0o700)
    keys = {name: Ed25519PrivateKey.generate() for name in NAMES}
    files = {}
    for name, key in keys.items():
        files[name] = holders / name
        files[name].write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
        files[name].chmod(0o600)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    db = open_store(private / "audit.db")
    init_admin(db, keys["root"], "root")
    for name, role in (("svc-prefect", "steward"), ("alice", "approver")):
        public = public_key_text(keys[name].public_key())
        fields = {"change": "add", "name": name, "role": role, "key_id": key_id(public), "reason": "team"}
        add_principal(db, make_act(db.conn, keys["root"], "principal", fields), name=name, role=role, public_key=public, reason="team")
    db.close()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "KEPSILON_"))}
    env.update(PREFECT_HOME=str(private / "prefect"), PREFECT_PORT="1", KEPSILON_AUDIT_DB=str(private / "audit.db"),
               KEPSILON_AUDIT_HEAD_LOG=str(private / "head.log"), KEPSILON_PREFECT_AUTH_FILE=str(private / "prefect-server.auth"))
    return {"files": files, "env": env, "private": private}


def _serve(team: dict, key: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "deployments" / "serve.sh")], env={**team["env"], "KEPSILON_SERVICE_KEY": str(key)},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("holder", "mode", "refusal"),
    [("mallory", 0o600, "is not registered"), ("alice", 0o600, "holds no steward role"),
     ("svc-prefect", 0o644, "can be read by others")],
    ids=["unregistered", "not-a-steward", "readable-by-others"],
)
def test_make_serve_refuses_to_start_with_a_service_key_that_cannot_sign(team, holder, mode, refusal):
    team["files"][holder].chmod(mode)
    done = _serve(team, team["files"][holder])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: parameter 'KEPSILON_SERVICE_KEY': ") and refusal in lines[0], done.stderr
    assert "PRIVATE KEY" not in done.stderr + done.stdout
    # Nothing started: no login generated for a server, no server log.
    assert not (team["private"] / "prefect-server.auth").exists()
    assert not (team["private"] / "prefect" / "server.log").exists()


def test_the_start_up_check_names_the_service_principal_or_warns_without_a_key(team):
    check = [str(ROOT / ".venv" / "bin" / "python"), "-m", "kepsilon.service_key", "check"]
    good = subprocess.run(check, env={**team["env"], "KEPSILON_SERVICE_KEY": str(team["files"]["svc-prefect"])},
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "act as the service principal 'svc-prefect'" in good.stderr, good.stderr
    missing = subprocess.run(check, env=team["env"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 0 and "will be refused before ε" in missing.stderr, missing.stderr
