"""Fault injection for the reliability suite: kill the process at a named point of a release.

``fault_point(name)`` does nothing unless env ``KEPSILON_FAULT_AT`` equals ``name``; then it sends
SIGKILL to its own process — the harshest crash there is (no ``finally``, no ``atexit``, no flush), so
what survives is exactly what was durable on disk at that moment. The points, in release order:

- ``after-reservation``: ε reserved, no seed drawn yet.
- ``after-noise``: seed sealed, ε marked spent, noise drawn; nothing staged.
- ``after-staging``: the first data file written and fsynced in the hidden staging folder.
- ``before-manifest``: both data files staged, the manifest not yet written.
- ``before-audit-commit``: the release completely staged (manifest written), its audit record not yet
  committed; nothing under the release's final name.
- ``after-audit-commit``: the audit record committed, the staging folder not yet renamed to the final name.

Production never sets the variable; the check costs one dictionary lookup.
"""

import os
import signal

ENV_FAULT_AT = "KEPSILON_FAULT_AT"
FAULT_POINTS = (
    "after-reservation",
    "after-noise",
    "after-staging",
    "before-manifest",
    "before-audit-commit",
    "after-audit-commit",
)


def fault_point(name: str) -> None:
    """SIGKILL this process if env ``KEPSILON_FAULT_AT`` names this point; otherwise do nothing."""
    if os.environ.get(ENV_FAULT_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)
