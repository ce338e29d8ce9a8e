"""``kepsilon officers``, run as the docs say: accounts of the officers' audit UI, hashes only, owner-only file;
bad input is one line naming the parameter, exit 2, and the password never appears in the output or the file."""

import os
import subprocess

from kepsilon.audit import officers

from .conftest import ROOT

KEPSILON = str(ROOT / ".venv" / "bin" / "kepsilon")


def _officers(tmp_path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, officers.ENV_ACCOUNTS: str(tmp_path / "private" / "accounts.json")}
    return subprocess.run([KEPSILON, "officers", *args], input=stdin, env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_add_list_check_remove(tmp_path):
    password = "a long enough password"
    refused = _officers(tmp_path, "check")
    assert refused.returncode == 2 and "no officer account" in refused.stderr and len(refused.stderr.splitlines()) == 1
    added = _officers(tmp_path, "add", "olivia", "--password-stdin", stdin=password + "\n")
    assert added.returncode == 0, added.stderr
    assert _officers(tmp_path, "list").stdout.split() == ["olivia"]
    assert _officers(tmp_path, "check").returncode == 0
    accounts = tmp_path / "private" / "accounts.json"
    assert accounts.stat().st_mode & 0o777 == 0o600 and accounts.parent.stat().st_mode & 0o777 == 0o700
    assert password not in accounts.read_text() and password not in added.stdout + added.stderr
    assert officers.check("olivia", password, accounts) and not officers.check("olivia", password + "x", accounts)
    assert _officers(tmp_path, "remove", "olivia").returncode == 0
    assert not officers.check("olivia", password, accounts)


def test_bad_input_is_one_line_exit_2(tmp_path):
    for args, stdin, word in ((("add", "olivia", "--password-stdin"), "short\n", "password"),
                              (("add", "../etc", "--password-stdin"), "a long enough password\n", "officer name"),
                              (("remove", "nobody"), "", "no such account")):
        done = _officers(tmp_path, *args, stdin=stdin)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and word in done.stderr and "Traceback" not in done.stderr
        assert "short" not in done.stderr


def test_an_unknown_name_costs_the_same_scrypt_as_a_known_one(tmp_path, monkeypatch):
    """``check`` hashes the given password for an unknown name too (its answer's time does not tell which names
    exist), against a constant entry with the accounts' parameters: the same scrypt, and never a match."""
    import hashlib

    path = tmp_path / "accounts.json"
    officers.set_password("olivia", "a long enough password", path)
    calls = []
    scrypt = hashlib.scrypt

    def counted(password, **parameters):
        calls.append({key: value for key, value in parameters.items() if key != "salt"})
        return scrypt(password, **parameters)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    assert officers.check("olivia", "a long enough password", path) is True
    assert officers.check("nobody", "a long enough password", path) is False
    assert officers.check("nobody", "", path) is False
    assert len(calls) == 3 and calls[1] == calls[2] == calls[0]  # N, r, p and the digest's length alike
