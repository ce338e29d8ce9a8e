"""Issue 24.1: a store put back from a backup, through the real CLI (``kepsilon release``, ``kepsilon audit ...``).

``set-cap P 2; release 1; copy the store (and its head log); release 2; put the copies back``: before this
change ``kepsilon audit verify`` said ok and a third release was published under a cap of 2. Three ways to
put the backup back, each in its own folder:

1. the store *and* its head log — they agree with each other; only the published manifest of release 2,
   which carries the chain's head at its publication, shows the rollback;
2. the store, with the head log deleted — the missing log is an error naming KEPSILON_AUDIT_HEAD_LOG;
3. the store alone, the newer head log kept — the head log shows the rollback.

In each, the third release must be refused before ε (exit 2, one line, no traceback, no new reservation, no
folder) and ``kepsilon audit verify`` must exit 2 naming the problem.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from kepsilon.audit.headlog import head_log_path

from .harness import POPULATION, Results, kepsilon, set_cap
from .scenarios import BadDay, _figures, _flat

CATEGORY = "rollback"

# How the backup is put back: (name, restore the old head log?, delete the head log?, what the refusal's one
# line names, what `verify` lists among its problems)
WAYS = (
    ("store and head log put back", True, False, "published manifest", "published manifest"),
    ("store put back, head log deleted", False, True, "rolled back", "KEPSILON_AUDIT_HEAD_LOG"),
    ("store put back, newer head log kept", False, False, "head log recorded", "head log recorded"),
)


class RollbackDay(BadDay):
    """A bad day whose checks are filed under this scenario's category."""

    def check(self, what: str, ok: bool, detail: str = "") -> bool:
        return self.results.add(CATEGORY, f"{self.name}: {what}", ok, detail)


def rollback_scenario(results: Results, env: dict, base: Path, source: Path, ways=WAYS) -> list[dict]:
    """Each way of putting a backup back (``ways``, all of them by default), through the CLI; returns the
    report's rows."""
    return [_one_way(results, env, base, source, *way) for way in ways]


def _one_way(results: Results, env: dict, base: Path, source: Path, name: str, restore_log: bool, delete_log: bool,
             names: str, listed: str) -> dict:
    day = RollbackDay(results, env, base, f"rollback: {name}", source)
    set_cap(day.env, day.work, 2.0)
    first = day.release("rollback-1", epsilon=1.0)
    day.check("release 1 of ε 1 published", first.returncode == 0, _flat(first.stderr)[-200:])
    store, log = day.db, head_log_path(day.db)
    day.check("the head log lives outside the store's folder", log.exists() and store.parent not in log.parents, str(log))
    backup = _backup(store, day.work / "backup")
    second = day.release("rollback-2", epsilon=1.0)
    day.check("release 2 of ε 1 published (the cap of 2 is now spent)", second.returncode == 0, _flat(second.stderr)[-200:])
    honest = _figures(day.db)
    for suffix in ("-wal", "-shm"):
        Path(str(store) + suffix).unlink(missing_ok=True)
    shutil.copy2(backup / "audit.db", store)
    if restore_log:
        shutil.copy2(backup / "heads", log)
    if delete_log:
        log.unlink()
    before = _figures(day.db)
    day.check("the put-back store shows one release and ε 1 spent", (before["published"], before["spent"]) == (1, 1.0),
              f"{before['published']} published, ε {before['spent']}")

    verify = kepsilon(["audit", "verify", "--format", "json"], day.env, day.work)
    day.check(f"`kepsilon audit verify` exits 2 listing '{listed}', no traceback",
              verify.returncode == 2 and listed.lower() in _flat(verify.stderr + verify.stdout).lower()
              and "Traceback" not in verify.stderr + verify.stdout,
              f"exit {verify.returncode}: {_flat(verify.stderr)[-240:]}")
    third = day.release("rollback-3", epsilon=1.0)
    day.refused_cleanly(third, "rollback-3", names, before)
    return {**day.row("refused before ε: rollback detected", third.returncode == 2, figures=honest),
            "refusal": _flat(third.stderr)[-220:]}


def _backup(store: Path, folder: Path) -> Path:
    """What an operator's backup holds: the store (its WAL merged first) and, for way 1, its head log."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    conn = sqlite3.connect(store)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    shutil.copy2(store, folder / "audit.db")
    shutil.copy2(head_log_path(store), folder / "heads")
    return folder


__all__ = ["CATEGORY", "POPULATION", "rollback_scenario"]
