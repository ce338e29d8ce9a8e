"""Benchmark cases ``audit-check-10k``, ``audit-check-100k`` and ``audit-check-records-10k``: the store check
a release runs before reserving ε (``kepsilon.audit.integrity.check_store``).

The stores are built, untimed, with the ledger's own ``set_cap``, ``reserve`` and ``mark_noise_drawn``
(and ``record_release`` for the records case), in populations of 100 releases. Each function runs in
one outer transaction instead of one commit per call: the rows and their chain entries are exactly
those the calls write one by one, without 100,000 fsyncs. The head log gets the final head, as after
the last commit. Timed: ``check_store(path)`` on a fresh process's first open, three times; the median
is reported. Target: under 1 s at 100,000 ledger entries.

``audit-check-records-10k`` adds a release record per release (about 40 chain entries each, as a real
manifest gives): the check is linear in chain entries, so this shows the cost of a store with history.
"""

from __future__ import annotations

import contextlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlite_utils import Database

RELEASES_PER_POPULATION = 100


def _manifest(release_id: str, key: str, population: str) -> dict:
    """A manifest of the shape the flow records (no data values), ~40 chain entries once recorded."""
    return {
        "release_id": release_id, "population_id": population, "idempotency_key": key, "spec_hash": "a" * 64,
        "k": 10, "epsilon": 1.0, "epsilon_split": {"HEIGHT": 1.0}, "algorithm": "mondrian", "scale_basis": "diameter",
        "mechanism": "laplace", "privacy_unit": "record", "neighbouring_relation": "records of one class",
        "confidence": 0.99, "suppression_budget": 0.05,
        "roles": {"explicit": ["ID", "NAME"], "k_quasi": ["YOB", "GENDER", "RACE", "MARITAL_STATUS"],
                  "e_quasi": ["HEIGHT"], "sensitive": ["RELIGION", "ICD"]},
        "hierarchies": {c: "c" * 64 for c in ("YOB", "GENDER", "RACE", "MARITAL_STATUS")},
        "source": {"path": "people.csv", "sha256": "d" * 64, "rows": 32440}, "rows_in": 32440,
        "rows_removed": {"anonymiser_suppression": 0, "confidence_suppression_record_rule": 83,
                         "confidence_suppression_class_rule": 55},
        "rows_published": 32302, "information_loss": {"measured": 0.2052, "predicted": 0.2074}, "linking_risk": 0.0301,
        "checks": [{"name": n, "success": True} for n in ("k", "suppression", "identifiers", "numeric", "finite", "rows")],
        "outputs": {"data.csv": "e" * 64, "data.parquet": "f" * 64},
        "software": {"kepsilon": "0.1.0", "python": "3.11.7", "numpy": "2.4.6", "pandas": "3.1.0", "prefect": "3.8.8"},
        "execution": {"flow_run_id": "run", "operator": "bench", "started_at": "t0", "finished_at": "t1"},
    }


def build_store(path: Path, ledger_entries: int, records: bool = False) -> int:
    """A store with ``ledger_entries`` ledger rows written by the ledger's functions; returns the count."""
    from kepsilon.audit import ledger
    from kepsilon.audit import records as records_module
    from kepsilon.audit.headlog import append_head, head_log_path
    from kepsilon.audit.store import database_file, open_store, write_transaction

    db = open_store(path)
    conn = db.conn
    written = 0

    @contextlib.contextmanager
    def inside_outer(db: Database) -> Iterator[sqlite3.Connection]:  # every call's writes join the one open transaction
        yield conn

    with write_transaction(db):
        ledger.write_transaction, records_module.write_transaction = inside_outer, inside_outer
        try:
            population = 0
            while written < ledger_entries:
                name = f"population-{population}"
                ledger.set_cap(db, name, 1000, "bench", "benchmark cap")
                written += 1
                for release in range(RELEASES_PER_POPULATION):
                    if written + 2 > ledger_entries:
                        break
                    release_id, key = f"{name}-release-{release}", f"{name}-key-{release}"
                    reservation = ledger.reserve(db, population_id=name, epsilon=1.0, idempotency_key=key,
                                                 release_id=release_id, operator="bench")
                    ledger.mark_noise_drawn(db, reservation.id)
                    written += 2
                    if records:
                        records_module.record_release(db, _manifest(release_id, key, name), outcome="published",
                                                      reservation_id=reservation.id)
                population += 1
                if written + 1 >= ledger_entries:
                    break
        finally:
            ledger.write_transaction = records_module.write_transaction = write_transaction
    count, head = conn.execute("SELECT seq, entry_hash FROM chain ORDER BY seq DESC LIMIT 1").fetchone()
    append_head(head_log_path(path), count, head, database_file(conn))
    rows = conn.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return rows


def _time_check(ledger_entries: int, records: bool = False) -> tuple[int, float]:
    from kepsilon.audit.integrity import check_store

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "audit.db"
        rows = build_store(path, ledger_entries, records)
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            check_store(path)
            timings.append(time.perf_counter() - started)
        return rows, statistics.median(timings)


def audit_check_10k() -> tuple[int, float]:
    """(ledger entries, seconds) of check_store on a store of 10,000 ledger entries."""
    return _time_check(10_000)


def audit_check_100k() -> tuple[int, float]:
    """(ledger entries, seconds) of check_store on a store of 100,000 ledger entries."""
    return _time_check(100_000)


def audit_check_records_10k() -> tuple[int, float]:
    """(ledger entries, seconds) of check_store on 10,000 ledger entries whose releases are all recorded."""
    return _time_check(10_000, records=True)


if __name__ == "__main__":
    from benchmarks.harness import measure

    for name, case in (("audit-check-10k", audit_check_10k), ("audit-check-100k", audit_check_100k),
                       ("audit-check-records-10k", audit_check_records_10k)):
        print(measure(name, case))
