"""The login of the Prefect servers kepsilon starts: Prefect's basic authentication (``auth_string``).

Prefect 3 protects a self-hosted server with one shared ``user:password`` string: the server process reads
``PREFECT_SERVER_API_AUTH_STRING`` and answers 401 to every API request without it (``/api/health`` and
``/api/ready`` excepted), its websockets (events, logs, task subscriptions, worker channel) close a
connection whose first message does not carry it, and its UI asks for it in a login form. A client (the
CLI, a worker, a flow run) sends it from ``PREFECT_API_AUTH_STRING``.

Two kinds of secret:

- ``make serve``'s: generated on first use, printed once, kept in ``KEPSILON_PREFECT_AUTH_FILE``
  (default ``./.kepsilon/prefect-server.auth``, 0600 in a 0700 folder, beside the store and the keys; never
  under the output folder), read again by every later ``make serve`` and by ``kepsilon release`` when it
  reports to that server.
- a throw-away server's (the CLI's own, the tests' and checks'): a fresh secret per server, held in memory
  and handed to its clients through their environment.

Run as ``python -m kepsilon.prefect_login secret``: prints the serve secret on stdout (for serve.sh to
export), and on stderr, once, the notice that it was generated and where it is kept.
"""

from __future__ import annotations

import base64
import secrets
import sys
from pathlib import Path

from kepsilon import settings
from kepsilon.audit.private import DEFAULT_FOLDER, owner_only, write_private_file

ENV_AUTH_FILE = "KEPSILON_PREFECT_AUTH_FILE"
DEFAULT_AUTH_FILE = DEFAULT_FOLDER / "prefect-server.auth"
# The user part of the string; Prefect checks the whole "user:password" string, not the user alone.
USER = "kepsilon"
# Prefect's settings: the server's and the client's.
SERVER_SETTING = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_SETTING = "PREFECT_API_AUTH_STRING"


def new_auth_string() -> str:
    """A fresh ``kepsilon:<256-bit random password>`` string."""
    return f"{USER}:{secrets.token_urlsafe(32)}"


def auth_file() -> Path:
    """Where ``make serve``'s secret is kept: KEPSILON_PREFECT_AUTH_FILE or ./.kepsilon/prefect-server.auth."""
    return settings.current().prefect_auth_file or Path(DEFAULT_AUTH_FILE)


def read_auth_string(path: Path | None = None) -> str | None:
    """The secret kept at ``path`` (default ``auth_file()``), or None when there is none (or it is empty)."""
    path = path or auth_file()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    owner_only(path, ENV_AUTH_FILE)
    return text or None


def serve_auth_string(path: Path | None = None) -> tuple[str, bool]:
    """``make serve``'s secret, created (0600, in a 0700 folder) if absent; True when this call created it.

    Two servers starting at once both try to create it; the loser reads the winner's (``write_private_file``
    links into place, never overwrites).
    """
    path = path or auth_file()
    existing = read_auth_string(path)
    if existing is not None:
        return existing, False
    created = write_private_file(path, (new_auth_string() + "\n").encode(), ENV_AUTH_FILE)
    kept = read_auth_string(path)
    assert kept is not None
    return kept, created


def authorization_header(auth_string: str | None) -> dict[str, str]:
    """The HTTP header a client sends with ``auth_string`` (as Prefect's client builds it); {} without one."""
    if not auth_string:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode("utf-8")).decode("ascii")}


def _main(argv: list[str]) -> int:
    if argv != ["secret"]:
        print("usage: python -m kepsilon.prefect_login secret", file=sys.stderr)
        return 2
    auth_string, created = serve_auth_string()
    if created:
        # Printed once: later runs read the file and say only where it is.
        print(
            f"Prefect login generated and kept in {auth_file()} (owner-only): {auth_string}\n"
            "  the UI asks for this whole string; kepsilon release, the worker and `prefect` commands "
            f"started by make serve read it from the file (others: export {CLIENT_SETTING}).",
            file=sys.stderr,
        )
    else:
        print(f"Prefect login: the string kept in {auth_file()}", file=sys.stderr)
    print(auth_string)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
