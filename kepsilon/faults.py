"""Fault injection for the reliability suite: kill the process at a named point of a release.

``fault_point(name)`` does nothing unless env ``KEPSILON_FAULT_AT`` equals ``name``; then it sends
SIGKILL to its own process — the harshest crash there is (no ``finally``, no ``atexit``, no flush), so
what survives is exactly what was durable on disk at that moment. The points, in release order:

- ``after-reservation``: ε reserved, no seed drawn yet.
- ``after-noise``: seed sealed, ε marked spent, noise drawn; nothing staged.
- ``after-staging``: inside ``write_atomically`` for the first data file: temp file written and
  fsynced, not yet renamed.
- ``before-manifest``: data files renamed into place, manifest not yet written.
- ``before-audit-commit``: release published (manifest written), the audit record not yet appended.

Production never sets the variable; the check costs one dictionary lookup.
"""

import os
import signal

ENV_FAULT_AT = "KEPSILON_FAULT_AT"
FAULT_POINTS = ("after-reservation", "after-noise", "after-staging", "before-manifest", "before-audit-commit")


def fault_point(name: str) -> None:
    """SIGKILL this process if env ``KEPSILON_FAULT_AT`` names this point; otherwise do nothing."""
    if os.environ.get(ENV_FAULT_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)
