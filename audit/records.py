"""Release records: a release's private record normalised into queryable tables, chained, in one transaction.

The private record (``kepsilon.record.ReleaseRecord``, kept whole in the ``releases.manifest`` column, as the
store's schema names it) is not the manifest published beside the data, which is projected from it
(``flows/manifest.public_manifest``). The record never holds data values (the flow builds it from counts,
hashes and parameters); as a last line of defence any key naming a raw seed is refused, so a seed cannot land
in the store in clear. A release that was not published records ``rows_published`` 0, whatever its record
counted before it stopped, and why it stopped in ``failure_reason``, so officers need not dig into the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlite_utils

from kepsilon.tasks.errors import SpecError

from .store import append, canonical_json, now, require_text, write_transaction

OUTCOMES = ("published", "failed", "refused")

# Scalar manifest fields copied to columns of `releases` for direct querying: column -> path in manifest.
_RELEASE_COLUMNS = {
    "population_id": ("population_id",),
    "idempotency_key": ("idempotency_key",),
    "spec_hash": ("spec_hash",),
    "k": ("k",),
    "epsilon": ("epsilon",),
    "privacy_model": ("privacy_model",),
    "delta": ("dp", "delta"),
    "algorithm": ("algorithm",),
    "scale_basis": ("scale_basis",),
    "mechanism": ("mechanism",),
    "confidence": ("confidence",),
    "suppression_budget": ("suppression_budget",),
    "source_path": ("source", "path"),
    "source_sha256": ("source", "sha256"),
    "source_rows": ("source", "rows"),
    "rows_in": ("rows_in",),
    "rows_published": ("rows_published",),
    "information_loss_measured": ("information_loss", "measured"),
    "information_loss_predicted": ("information_loss", "predicted"),
    "linking_risk": ("linking_risk",),
    "l_diversity_min": ("disclosure", "l_diversity_min"),
    "t_closeness_max": ("disclosure", "t_closeness_max"),
    "homogeneous_groups": ("disclosure", "homogeneous_groups"),
    "prosecutor_risk": ("disclosure", "prosecutor_risk"),
    "output_dir": ("output_dir",),
    "seed_commitment": ("seed_commitment",),
    "operator": ("execution", "operator"),
    "flow_run_id": ("execution", "flow_run_id"),
    "started_at": ("execution", "started_at"),
    "finished_at": ("execution", "finished_at"),
    "kepsilon_version": ("software", "kepsilon"),
    "git_commit": ("software", "git_commit"),
}

# Manifest sections flattened into `parameters` rows (name like "epsilon_split.age").
_PARAMETER_SECTIONS = (
    "k",
    "epsilon",
    "privacy_model",
    "dp",
    "epsilon_split",
    "algorithm",
    "scale_basis",
    "mechanism",
    "confidence",
    "suppression_budget",
    "sensitive_criteria",
    "max_linking_risk",
    "max_prosecutor_risk",
    "hierarchies",
    "roles",
    "anonymiser",
    "perturbation",
    "privacy_unit",
    "neighbouring_relation",
)


def _get(manifest: Mapping[str, Any], path: tuple[str, ...]):
    value: object = manifest
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return _scalar(value)


def _scalar(value):
    """A value SQLite can store in a column: numpy scalars unwrapped, containers as canonical JSON."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        value = value.item()
    if isinstance(value, (dict, list, tuple)):
        return canonical_json(value)
    return value


def _refuse_raw_seed(value, where: str = "manifest") -> None:
    """Refuse any key that looks like a raw seed (only its commitment may be recorded)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            lowered = str(key).lower()
            if "seed" in lowered and "commitment" not in lowered:
                raise SpecError(f"{where}.{key}", "a seed may only be recorded as its commitment (seed_commitment)")
            _refuse_raw_seed(inner, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for inner in value:
            _refuse_raw_seed(inner, where)


def _flatten(prefix: str, value) -> list[tuple[str, object]]:
    """Nested dicts as dotted names; lists and scalars as one stored value each."""
    if isinstance(value, dict):
        items = []
        for key in sorted(value):
            items.extend(_flatten(f"{prefix}.{key}", value[key]))
        return items
    return [(prefix, _scalar(value))]


# Longer reasons are cut: a reason is a class, a message and check names, not a document.
_MAX_REASON = 1000


def failure_reason(manifest: Mapping[str, Any], outcome: str) -> str | None:
    """Why a release was not published, in one line: ``"ErrorClass: message; failed checks: a, b"``.

    From ``manifest["failure"]`` (``str(error)``) and ``manifest["failure_class"]`` as the flow sets them,
    else a refusal's ``refusal``/``refusal_class``, else the older ``error``/``reason`` keys; failed checks
    are added when the message does not already name them. The flow's messages name columns and
    parameters, never values (``KepsilonError``'s rule). None for a published release.
    """
    if outcome == "published":
        return None
    message = next((manifest[k] for k in ("failure", "refusal", "error", "reason") if manifest.get(k)), None)
    error_class = next((manifest[k] for k in ("failure_class", "refusal_class") if manifest.get(k)), None)
    parts = []
    if error_class and message:
        parts.append(f"{error_class}: {message}")
    elif error_class or message:
        parts.append(str(error_class or message))
    failed = [str(c.get("name")) for c in manifest.get("checks") or [] if isinstance(c, dict) and not c.get("success")]
    unnamed = [name for name in failed if not parts or name not in parts[0]]
    if unnamed:
        parts.append("failed checks: " + ", ".join(unnamed))
    if not parts:
        return None
    reason = " ".join("; ".join(parts).split())  # one line
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"


def record_release(
    db: sqlite_utils.Database, manifest: Mapping[str, Any], *, outcome: str, reservation_id: int | None
) -> int:
    """Store a release's private record as rows of releases/parameters/checks/outputs/stage_counts/software.

    Returns the new ``releases.id``. Missing keys are tolerated (failed and refused releases have
    partial manifests); ``release_id`` is required. A failed or refused release gets ``rows_published``
    0 and its ``failure_reason``. Everything is written, with its chain entries, in
    one transaction: a crash leaves either the whole record or none of it.
    """
    if not isinstance(manifest, dict):
        raise SpecError("manifest", "must be a mapping")
    if outcome not in OUTCOMES:
        raise SpecError("outcome", f"must be one of {', '.join(OUTCOMES)}")
    release_id = require_text("manifest.release_id", manifest.get("release_id"))
    _refuse_raw_seed(manifest)
    row = {column: _get(manifest, path) for column, path in _RELEASE_COLUMNS.items()}
    if outcome != "published":
        row["rows_published"] = 0  # nothing reached readers, whatever was counted before the stop
    row.update(
        release_id=release_id,
        outcome=outcome,
        outcome_detail=_scalar(manifest.get("error") or manifest.get("reason")),
        failure_reason=failure_reason(manifest, outcome),
        reservation_id=reservation_id,
        manifest=canonical_json(manifest),
        recorded_at=now(),
    )
    with write_transaction(db) as conn:
        if reservation_id is not None and not conn.execute(
            "SELECT 1 FROM ledger WHERE id = ? AND kind = 'reserve'", (reservation_id,)
        ).fetchone():
            raise SpecError("reservation_id", "no such reservation")
        release = append(conn, "releases", row)
        for section in _PARAMETER_SECTIONS:
            if section in manifest:
                for name, value in _flatten(section, manifest[section]):
                    append(conn, "parameters", {"release": release, "name": name, "value": value})
        for check in manifest.get("checks") or []:
            append(
                conn,
                "checks",
                {"release": release, "name": str(check.get("name")), "success": int(bool(check.get("success")))},
            )
        for path, sha256 in (manifest.get("outputs") or {}).items():
            append(conn, "outputs", {"release": release, "path": str(path), "sha256": _scalar(sha256)})
        for stage, removed in (manifest.get("rows_removed") or {}).items():
            append(conn, "stage_counts", {"release": release, "stage": str(stage), "rows_removed": _scalar(removed)})
        for package, version in (manifest.get("software") or {}).items():
            append(conn, "software", {"release": release, "package": str(package), "version": _scalar(version)})
    return release
