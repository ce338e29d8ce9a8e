"""The officers' accounts of the audit UI (``make audit-ui``): names and scrypt password hashes, owner-only.

The file (``KEPSILON_AUDIT_UI_ACCOUNTS``, default ``./.kepsilon/audit-ui-accounts.json``) is created 0600 in a
0700 folder, beside the store and the keys, and rewritten whole under a temporary name then renamed, so a
reader never sees half of it. It holds no password, only ``scrypt$N$r$p$salt$hash`` strings: whoever reads it
must still guess each password, at scrypt's cost per guess. The Datasette plugin
(``audit/datasette_plugins/officer_login.py``) reads it on every login and on every request, so an account
removed here is refused at the next request, without restarting the server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
from pathlib import Path

from kepsilon import settings

from .private import DEFAULT_FOLDER, FILE_MODE, owner_only, private_folder

ENV_ACCOUNTS = "KEPSILON_AUDIT_UI_ACCOUNTS"
DEFAULT_ACCOUNTS = DEFAULT_FOLDER / "audit-ui-accounts.json"
# scrypt's cost: 16 MiB and about 50 ms per guess on this project's machines (RFC 7914's interactive setting).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MIN_PASSWORD_LENGTH = 12
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


class AccountError(ValueError):
    """A bad account name or password, or an account that does not exist: one line, no secret in it."""


def accounts_file() -> Path:
    """KEPSILON_AUDIT_UI_ACCOUNTS or ./.kepsilon/audit-ui-accounts.json."""
    return settings.current().audit_ui_accounts or Path(DEFAULT_ACCOUNTS)


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64) of ``password`` with a fresh 16-byte salt."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def password_matches(password: str, stored: str) -> bool:
    """Whether ``password`` hashes to ``stored`` (compared in constant time); False for a malformed entry."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(password.encode("utf-8"), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                                dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def load_accounts(path: Path | None = None) -> dict[str, str]:
    """Name -> password hash; {} when the file does not exist."""
    path = path or accounts_file()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    owner_only(path, ENV_ACCOUNTS)
    officers = json.loads(text).get("officers", {})
    return {str(name): str(stored) for name, stored in officers.items()}


def _save(accounts: dict[str, str], path: Path) -> None:
    folder = private_folder(path.parent, ENV_ACCOUNTS)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            json.dump({"officers": dict(sorted(accounts.items()))}, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def set_password(name: str, password: str, path: Path | None = None) -> bool:
    """Add officer ``name`` or change their password; True when the account is new."""
    if not NAME_PATTERN.fullmatch(name):
        raise AccountError("officer name: letters, digits and . _ @ - only, at most 64, starting with a letter or digit")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise AccountError(f"password: at least {MIN_PASSWORD_LENGTH} characters")
    path = path or accounts_file()
    accounts = load_accounts(path)
    new = name not in accounts
    accounts[name] = hash_password(password)
    _save(accounts, path)
    return new


def remove(name: str, path: Path | None = None) -> None:
    """Remove officer ``name``: their next request is refused (the plugin rereads the file)."""
    path = path or accounts_file()
    accounts = load_accounts(path)
    if name not in accounts:
        raise AccountError(f"officer {name!r}: no such account")
    del accounts[name]
    _save(accounts, path)


def check(name: str, password: str, path: Path | None = None) -> bool:
    """Whether ``name`` is an officer and ``password`` is theirs. An unknown name costs a hash too, so the
    answer's time does not tell which names exist."""
    stored = load_accounts(path).get(name)
    if stored is None:
        password_matches(password, _DUMMY_HASH)
        return False
    return password_matches(password, stored)


# What an unknown name is checked against: a well-formed entry with the accounts' parameters, so that checking
# it costs the same scrypt as a real one. Its digest is all zeros (no password is expected to hash to it), and
# making it costs nothing (a real hash here cost every process importing this module, every `kepsilon` command
# among them, 70 ms).
_DUMMY_HASH = "$".join(("scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P),
                        base64.b64encode(b"kepsilon-dummy-s").decode(), base64.b64encode(bytes(32)).decode()))
