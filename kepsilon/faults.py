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

The Dask engine adds points of its own (``DASK_FAULT_POINTS``): in the flow's process, ``dask-<stage>``
fires when the first partition of that stage has finished (the others still running); in a worker
process, ``worker-distribute`` and ``worker-publish-part`` fire inside the task, after it wrote its
outputs. With env ``KEPSILON_FAULT_ONCE`` naming a path, a point kills only the first process to reach
it (the one that creates the path): a killed worker's task, run again, then completes.

A point can also *hold* instead of kill, so that a scenario acts at exactly that moment however busy
the machine is: with env ``KEPSILON_HOLD_AT`` naming the point and ``KEPSILON_HOLD_FILE`` a path, the
release writes ``PATH.reached`` there and waits (up to ``HOLD_SECONDS``, or env ``KEPSILON_HOLD_SECONDS``)
until ``PATH`` exists.

Production never sets the variables; the check costs two dictionary lookups.
"""

import os
import signal
import time
from pathlib import Path

from kepsilon import settings

ENV_FAULT_AT = "KEPSILON_FAULT_AT"
ENV_HOLD_AT = "KEPSILON_HOLD_AT"
ENV_HOLD_FILE = "KEPSILON_HOLD_FILE"
HOLD_SECONDS = 120
FAULT_POINTS = (
    "after-reservation",
    "after-noise",
    "after-staging",
    "before-manifest",
    "before-audit-commit",
    "after-audit-commit",
)
ENV_FAULT_ONCE = "KEPSILON_FAULT_ONCE"
DASK_FAULT_POINTS = ("dask-intake", "dask-distribute", "dask-perturb-suppress", "dask-publish-part")
WORKER_FAULT_POINTS = ("worker-distribute", "worker-publish-part")


def fault_point(name: str) -> None:
    """SIGKILL this process if env ``KEPSILON_FAULT_AT`` names this point, hold it if ``KEPSILON_HOLD_AT``
    does; otherwise do nothing."""
    if settings.current().fault_at == name and _first_to_arrive():
        os.kill(os.getpid(), signal.SIGKILL)
    if settings.current().hold_at == name:
        hold_file = settings.current().hold_file
        if hold_file is None:
            raise RuntimeError(f"{ENV_HOLD_AT} is set without {ENV_HOLD_FILE}")
        _hold(hold_file)


def _first_to_arrive() -> bool:
    """True unless ``KEPSILON_FAULT_ONCE`` names a path that exists already (then someone was killed)."""
    once = settings.current().fault_once
    if once is None:
        return True
    try:
        os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def _hold(release: Path) -> None:
    """Say the point is reached, then wait for the scenario to create ``release``."""
    release.with_name(release.name + ".reached").touch()
    deadline = time.monotonic() + float(settings.current().hold_seconds or HOLD_SECONDS)
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
