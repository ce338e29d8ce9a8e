"""Advice events: a run of the parameter advisor, recorded as a read of private data.

The advisor (``kepsilon advise``, the ``advise`` flow) spends no ε and publishes nothing, but it reads the
private table and shows a steward figures computed from it; officers need to see that it happened, by
whom, on which source and spec. The row holds ids, hashes and the grid, never a figure of the advice.
"""

from __future__ import annotations

import json

import sqlite_utils

from kepsilon.tasks.errors import SpecError

from .store import append, now, require_text, write_transaction


def record_advice(
    db: sqlite_utils.Database,
    *,
    population_id: str,
    spec_hash: str,
    source_sha256: str,
    source_rows: int,
    actor: str,
    via: str,
    k_values: list[int],
    epsilon_values: list[float],
    draws: int,
    flow_run_id: str | None = None,
    report_dir: str | None = None,
) -> int:
    """Append one advice event and its chain entry; returns its id."""
    if via not in ("cli", "flow"):
        raise SpecError("via", "must be 'cli' or 'flow'")
    row = {
        "population_id": require_text("population_id", population_id),
        "spec_hash": require_text("spec_hash", spec_hash),
        "source_sha256": require_text("source_sha256", source_sha256),
        "source_rows": int(source_rows),
        "actor": require_text("actor", actor),
        "via": via,
        "flow_run_id": flow_run_id,
        "k_values": json.dumps([int(k) for k in k_values]),
        "epsilon_values": json.dumps([float(e) for e in epsilon_values]),
        "draws": int(draws),
        "report_dir": report_dir,
        "created_at": now(),
    }
    with write_transaction(db) as conn:
        return append(conn, "advice_events", row)
