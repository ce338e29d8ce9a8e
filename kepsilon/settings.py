"""Every ``KEPSILON_*`` environment variable the package reads, in one typed object.

``current()`` reads the environment each time it is called, never at import: a test that sets a variable
with ``monkeypatch.setenv``, the CLI that sets ``KEPSILON_AUDIT_DB`` from ``--db``, and a Dask worker that
inherits the flow's environment all see the value in force at the moment of use.

One rule for every variable: **an empty value is the same as an unset one** (the default applies). Numbers
are kept as the text given and parsed where they are used, so that a bad value is refused by the module that
knows its meaning, naming the variable, and a bad number in one variable never breaks a command that does not
read it.

The table of docs/settings.md is checked against ``FIELDS`` by ``tests/test_settings.py``; a variable read
anywhere else in the tree (tests, benchmarks, the deployments) is listed there too, under "tools".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def _setting(env: str, doc: str, default: str) -> Any:
    """A field read from ``env``; ``doc`` says what it changes, ``default`` what applies when it is unset."""
    return field(default=None, metadata={"env": env, "doc": doc, "default": default})


@dataclass(frozen=True)
class Settings:
    """The ``KEPSILON_*`` variables as read now; ``None`` where unset or empty (the default applies)."""

    audit_db: Path | None = _setting(
        "KEPSILON_AUDIT_DB",
        "The audit store's SQLite file (the CLI's `--db` sets it for the run).",
        "`./.kepsilon/audit.db`",
    )
    audit_busy_timeout: str | None = _setting(
        "KEPSILON_AUDIT_BUSY_TIMEOUT",
        "Seconds a write waits for another writer's lock on the store (positive, at most one day).",
        "60",
    )
    audit_head_log: Path | None = _setting(
        "KEPSILON_AUDIT_HEAD_LOG",
        "The store's head log (detects a store put back from a backup); keep it where the store's writers, "
        "not its readers, can write.",
        "`$XDG_STATE_HOME/kepsilon/heads/<store name>-<hash>.heads` (`~/.local/state` without `XDG_STATE_HOME`)",
    )
    default_cap: str | None = _setting(
        "KEPSILON_DEFAULT_CAP",
        "A lifetime ε cap created for a population that has none, recorded as set by `kepsilon-default` "
        "(`make demo` sets 10).",
        "none: a population without a cap is refused",
    )
    seed_key: str | None = _setting(
        "KEPSILON_SEED_KEY",
        "The Fernet key (urlsafe base64) that seals each release's noise seed; wins over the key file.",
        "read from the key file",
    )
    seed_key_file: Path | None = _setting(
        "KEPSILON_SEED_KEY_FILE",
        "The seed key's file, created 0600 in a 0700 folder on first use.",
        "`./.kepsilon/seed.key`",
    )
    fingerprint_key: str | None = _setting(
        "KEPSILON_FINGERPRINT_KEY",
        "The source fingerprint's HMAC key (64 hex digits), e.g. for Dask workers on other machines; wins over "
        "the key file.",
        "read from the key file",
    )
    fingerprint_key_file: Path | None = _setting(
        "KEPSILON_FINGERPRINT_KEY_FILE",
        "The fingerprint key's file, created 0600 on first use.",
        "`fingerprint.key` beside the seed key file",
    )
    reports_dir: Path | None = _setting(
        "KEPSILON_REPORTS_DIR",
        "The root of the private report folders (figures, advice, certificates); refused inside `output_dir`.",
        "`./reports/private`",
    )
    worker_tracebacks: str | None = _setting(
        "KEPSILON_WORKER_TRACEBACKS",
        "`hidden` keeps failed Dask tasks' tracebacks off the local workers' consoles; `kepsilon release` and "
        "`kepsilon check` set it (`shown` with `--debug`).",
        "shown",
    )
    signing_key: Path | None = _setting(
        "KEPSILON_SIGNING_KEY",
        "The Ed25519 private key (OpenSSH or PKCS#8 PEM, 0600) that signs this process's acts once the store has "
        "principals; `--key` sets it for a command (docs/identity.md).",
        "none: acts are unsigned (refused in a store with principals)",
    )
    service_key: Path | None = _setting(
        "KEPSILON_SERVICE_KEY",
        "The deployment's service principal's private key (a registered steward's, 0600): `make serve` checks it at "
        "start-up and gives it to the worker alone, as `KEPSILON_SIGNING_KEY`, so scheduled and UI-launched releases "
        "are signed by it (docs/identity.md).",
        "none: the deployment's runs are unsigned (refused in a store with principals)",
    )
    prefect_auth_file: Path | None = _setting(
        "KEPSILON_PREFECT_AUTH_FILE",
        "The file holding `make serve`'s Prefect login string (generated on first use, 0600); clients read it "
        "(docs/logins.md).",
        "`./.kepsilon/prefect-server.auth`",
    )
    audit_ui_accounts: Path | None = _setting(
        "KEPSILON_AUDIT_UI_ACCOUNTS",
        "The officers' accounts of `make audit-ui` (scrypt hashes, 0600; `kepsilon officers add`).",
        "`./.kepsilon/audit-ui-accounts.json`",
    )
    fault_at: str | None = _setting(
        "KEPSILON_FAULT_AT",
        "Test hook (`make reliability`): the fault point at which the release SIGKILLs itself.",
        "no fault",
    )
    fault_once: Path | None = _setting(
        "KEPSILON_FAULT_ONCE",
        "Test hook: a path; only the first process to reach the fault point (and create the file) is killed.",
        "every process reaching the point",
    )
    hold_at: str | None = _setting(
        "KEPSILON_HOLD_AT",
        "Test hook: the fault point at which the release waits for `KEPSILON_HOLD_FILE` to appear.",
        "no hold",
    )
    hold_file: Path | None = _setting(
        "KEPSILON_HOLD_FILE",
        "Test hook: the file whose creation ends a hold (`<file>.reached` says the point was reached).",
        "none (needed with `KEPSILON_HOLD_AT`)",
    )
    hold_seconds: str | None = _setting(
        "KEPSILON_HOLD_SECONDS",
        "Test hook: the longest a hold waits, in seconds.",
        "120",
    )


FIELDS: tuple[tuple[str, str, str, str], ...] = tuple(
    (f.name, f.metadata["env"], f.metadata["default"], f.metadata["doc"]) for f in fields(Settings)
)
"""(attribute, variable, default, what it does) for every setting, in declaration order."""

_PATHS = frozenset(f.name for f in fields(Settings) if "Path" in str(f.type))


def current() -> Settings:
    """The settings in force now, read from ``os.environ`` (empty counts as unset)."""
    values: dict[str, Any] = {}
    for name, env, _default, _doc in FIELDS:
        raw = os.environ.get(env)
        if raw:
            values[name] = Path(raw) if name in _PATHS else raw
    return Settings(**values)


def markdown_table() -> str:
    """The table of docs/settings.md: one row per setting, in declaration order (``python -m kepsilon.settings``)."""
    rows = ["| variable | default when unset or empty | what it sets |", "|---|---|---|"]
    rows += [f"| `{env}` | {default} | {doc} |" for _name, env, default, doc in FIELDS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
