"""The key a deployment's scheduled and UI-launched runs sign with: ``make serve``'s service principal.

A run started from the Prefect UI or by a schedule has no person at a terminal to give ``--key``: it runs in a
child of the worker, and signs its reservation with the key file named by the worker's KEPSILON_SIGNING_KEY
(``tasks/record.py: release_operator``). ``make serve`` (deployments/serve.sh) takes that file from
KEPSILON_SERVICE_KEY and hands it to the worker alone, as KEPSILON_SIGNING_KEY: the server and the ``prefect
deploy`` commands never see it, and a person's own KEPSILON_SIGNING_KEY in the shell that starts ``make serve``
is dropped, so the deployment never signs as that person. The key is never a flow parameter.

Run as ``python -m kepsilon.service_key check`` before the server starts: it says whom the runs will act as, or
refuses to start (one line, exit 2) with a key that could not sign a release in this store — unreadable, readable
by others, not registered, revoked, without the steward role — so that a team learns it at start-up rather than
from a refused 2 a.m. release. Without a key, a store with principals gets a warning: its releases will be refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kepsilon import settings

ENV_SERVICE_KEY = "KEPSILON_SERVICE_KEY"


def service_principal(store: Path, key: Path | None) -> str:
    """Whom the deployment's runs will act as, in one line; raises ``SpecError`` naming KEPSILON_SERVICE_KEY (one
    line) when the key cannot sign.

    Only public facts are read: the store's principals and the key's public half (the key id, never key material).
    """
    from kepsilon.audit.principals import is_signed, principal_of
    from kepsilon.audit.signing import key_id, load_private_key, public_key_text
    from kepsilon.audit.store import open_store
    from kepsilon.tasks.errors import SpecError

    signed = False
    state = None
    public = None
    if key is not None:
        public = public_key_text(load_private_key(key, ENV_SERVICE_KEY).public_key())
    if store.exists():
        db = open_store(store)
        try:
            signed = is_signed(db.conn)
            state = principal_of(db.conn, public) if signed and public is not None else None
        finally:
            db.close()
    if public is None:
        if signed:
            return (f"warning: the audit store {str(store)!r} has principals and {ENV_SERVICE_KEY} names no key: scheduled "
                    "and UI-launched releases will be refused before ε (docs/identity.md)")
        return "scheduled and UI-launched releases are attributed by name (the audit store has no principals)"
    if not signed:
        raise SpecError(
            ENV_SERVICE_KEY, f"the audit store {str(store)!r} has no principals, so nobody could check the service key's "
            "signature; register it first (kepsilon audit init, then kepsilon audit principal add … --role steward)"
        )
    if state is None or state.revoked or "steward" not in state.roles:
        why = "is not registered" if state is None else "was revoked" if state.revoked else "holds no steward role"
        raise SpecError(
            ENV_SERVICE_KEY, f"the service key {key_id(public)} {why} in the audit store; register it with "
            "`kepsilon audit principal add NAME --role steward --public-key FILE.pub` (docs/identity.md)"
        )
    return f"scheduled and UI-launched releases act as the service principal {state.name!r} (steward, key {key_id(public)})"


def _main(argv: list[str]) -> int:
    if argv != ["check"]:
        print("usage: python -m kepsilon.service_key check", file=sys.stderr)
        return 2
    from kepsilon.audit.store import store_path
    from kepsilon.tasks.errors import SpecError

    configured = settings.current().service_key
    try:
        print(service_principal(store_path().resolve(), Path(configured) if configured is not None else None), file=sys.stderr)
    except SpecError as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
