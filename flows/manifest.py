"""A release's two documents: its private record, and the public manifest projected from it.

The private record (``kepsilon.record.ReleaseRecord``) is what a release was: identity and parameters
(``base_record``, before any stage runs), then every figure the stages compute, private ones included. It
goes to the audit store only. The manifest published next to the data (``manifest.json``,
``kepsilon.record.PublicManifest``) is built from it by ``public_manifest``, field by field, and holds only the
fields ``PUBLIC_FIELDS`` allows (derived from ``PublicManifest``); the record keeps a copy of it
(``public_manifest``), so the published file and the audit record cannot disagree.
"""

import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import kepsilon
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.guarantee import DP_NEIGHBOURS, Guarantee
from kepsilon.record import (
    DpEntries,
    PublicManifest,
    PublicMethod,
    PublicRecords,
    ReleaseRecord,
    allowed_fields,
)

_LIBRARIES = ("prefect", "numpy", "pandas", "great_expectations", "sqlite-utils", "pydantic", "pyarrow")


def idempotency_key(spec: ReleaseSpec, source_sha256: str) -> str:
    """One key per logical release: same population, release id, spec and source bytes ⇒ same key.

    A rerun with this key spends no more ε and re-derives the same noise from the escrowed seed.
    """
    parts = {
        "population_id": spec.population_id,
        "release_id": spec.release_id,
        "spec_hash": spec.spec_hash(),
        "source_sha256": source_sha256,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def content_key(spec: ReleaseSpec, source_fingerprint: str) -> str:
    """What a release would publish from, without its name: population, spec (its release id left out) and the
    source's fingerprint. Two runs with the same key publish from the same data with the same parameters (a
    nightly ``{date}`` release over an unchanged source). Private: it is derived from the source's fingerprint."""
    parts = {
        "population_id": spec.population_id,
        "spec_hash": spec.model_copy(update={"release_id": "release"}).spec_hash(),
        "source_sha256": source_fingerprint,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def software_versions() -> dict:
    """Versions of kepsilon, Python and the main libraries, and the git commit when there is one."""
    versions: dict[str, str | None] = {"kepsilon": kepsilon.__version__, "python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name.replace("-", "_")] = None
    versions["git_commit"] = git_commit()
    return versions


def git_commit() -> str | None:
    """The commit of the kepsilon checkout, if it runs from one (None for an installed wheel)."""
    root = Path(kepsilon.__file__).resolve().parent.parent
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and len(commit) == 40 else None


def base_record(spec: ReleaseSpec, source_report: dict, key: str) -> ReleaseRecord:
    """The first part of the private record, known before any stage runs: identity and parameters."""
    record: ReleaseRecord = {
        "release_id": spec.release_id,
        "population_id": spec.population_id,
        "idempotency_key": key,
        "spec_hash": spec.spec_hash(),
        "k": spec.k,
        "epsilon": spec.epsilon,
        "epsilon_split": spec.epsilon_split(),
        "algorithm": spec.algorithm,
        "scale_basis": spec.scale_basis,
        "mechanism": "laplace",
        "privacy_unit": "record",
        "neighbouring_relation": "records of one equivalence class differing in their ε-quasi values",
        "confidence": spec.confidence,
        "suppression_budget": spec.suppression_budget,
        "sensitive_criteria": spec.roles.sensitive_criteria(),
        "max_linking_risk": spec.max_linking_risk,
        "max_prosecutor_risk": spec.max_prosecutor_risk,
        "roles": spec.roles.names(),
        "source": {"path": spec.source.path, **source_report},
        "rows_in": source_report["rows"],
        "content_key": content_key(spec, source_report["sha256"]),
        "software": software_versions(),
        "privacy_model": spec.privacy_model,
    }
    if spec.privacy_model == "dp":
        record.update(dp_parameters(spec))
    return record


def dp_parameters(spec: ReleaseSpec) -> DpEntries:
    """The DP mode's entries of the private record (and, under ``method``, of the manifest): its (ε, δ) and every parameter they follow from.

    All are public parameters (from the spec and the theorem); none is computed from the data. The
    node is added once known: the spec's, or the DP search's output (``dp.node``). Fields of the
    method's own mode that mean nothing here are None.
    """
    figures = Guarantee.for_spec(spec).parameters()
    dp = spec.dp_settings()
    return {
        "algorithm": "dp-search" if dp.search is not None else "fixed-node",
        "scale_basis": None,
        "mechanism": "bernoulli-sampling+safe-k-anonymisation"
        + ("+exponential-mechanism" if dp.search is not None else ""),
        "neighbouring_relation": DP_NEIGHBOURS,
        "confidence": None,
        "suppression_budget": None,
        "max_linking_risk": None,
        "dp": {
            "epsilon_search": figures["epsilon_search"],
            "epsilon_anonymisation": figures["epsilon_anonymisation"],
            "beta": figures["beta"],
            "beta_chosen_by": "spec" if dp.beta is not None else "1 - exp(-epsilon_anonymisation)",
            "delta": figures["delta"],
            "max_delta": dp.max_delta,
            "node": dict(dp.node) if dp.node is not None else None,
            "node_chosen_by": "spec" if dp.node is not None else "exponential mechanism (DP search)",
            "search_strategy": dp.search.strategy if dp.search is not None else None,
            "search_steps": None,
            "sensitive_levels": dict(dp.sensitive_levels),
        },
    }


# --- the public manifest ---------------------------------------------------------------------------
#
# The record above is the release's *private* record: it goes to the audit store only. What is published
# beside the data is built from it by `public_manifest`, field by field: the fields of `PublicManifest`
# (kepsilon/record.py), which says why each is public. Anything computed from private values (errors,
# risks, scales, widths, diameters, clamped or zero counts, the source's SHA-256, the idempotency key, the
# operator, paths) is not on it: an adversary who knows every other record can solve such a figure for the
# one they do not know, and a hash of a guessable source confirms a guess offline.

PUBLIC_FIELDS = allowed_fields(PublicManifest)
"""The public manifest's fields, from ``PublicManifest``: a dict lists the allowed keys below it; ``"*"`` allows
any keys below (column names, file names, package names, stages); ``None`` is a leaf."""

METHOD_NAME = "(k,ε)-anonymity (Holohan, Antonatos, Braghin, Mac Aonghusa 2017)"
DP_METHOD_NAME = (
    "(ε,δ)-differential privacy by sampling and safe k-anonymisation (Li, Qardaji, Su 2012), "
    "node by the exponential mechanism (SafePub: Bild, Kuhn, Prasser 2018)"
)


class PrivateFieldInPublicManifest(ValueError):
    """A field that is not on the public list was about to be published."""


def check_public_fields(document: Mapping[str, Any], allowed: Mapping[str, Any] = PUBLIC_FIELDS, where: str = "manifest") -> None:
    """Raise if ``document`` holds a key that ``PUBLIC_FIELDS`` does not allow (a defence in depth:
    the publish step calls it on every manifest it writes)."""
    for key, value in document.items():
        if key not in allowed:
            raise PrivateFieldInPublicManifest(f"{where}.{key} is not a public field")
        below = allowed[key]
        if isinstance(below, dict):
            if not isinstance(value, dict):
                raise PrivateFieldInPublicManifest(f"{where}.{key} must be a mapping")
            check_public_fields(value, below, f"{where}.{key}")


def hierarchy_descriptions(spec: ReleaseSpec, hashes: dict) -> dict:
    """Name and SHA-256 of each hierarchy a release used: a file's name, or a builder's public definition.

    The k-quasis' always; in the DP mode also the ε-quasis' and those of sensitive columns released
    above level 0 (``hashes`` names exactly the hierarchies used).
    """
    k_quasis = {quasi.column for quasi in spec.roles.k_quasi}
    described = {}
    for entry in spec.roles.column_entries():
        hierarchy = entry.hierarchy
        if hierarchy is None or (entry.column not in k_quasis and entry.column not in hashes):
            continue
        shown: dict[str, object]
        if isinstance(hierarchy, str):
            shown = {"file": Path(hierarchy).name}
        else:
            shown = {"builder": hierarchy.model_dump(mode="json")}
        described[entry.column] = {**shown, "sha256": hashes.get(entry.column)}
    return described


def public_manifest(record: ReleaseRecord, spec: ReleaseSpec, grids: dict[str, float], guarantee: str) -> PublicManifest:
    """The manifest published beside the data, built only from public fields of the private record: the
    record's projection onto ``PublicManifest`` (the DP mode's through ``dp_public_manifest``).

    ``grids``: the public snapping grid of each ε-quasi (from its bounds and ε share). ``columns``
    (each published column's role and type, ``publish.published_columns``) comes from the record.
    Statistics the spec opts in through ``publish_statistics`` go under ``unprotected_statistics``; they are
    computed from the private data and are not protected by the method.
    """
    if spec.privacy_model == "dp":
        return dp_public_manifest(record, spec, guarantee)
    method: PublicMethod = {
        "name": METHOD_NAME,
        "k": spec.k,
        "epsilon": spec.epsilon,
        "epsilon_split": spec.epsilon_split(),
        "algorithm": spec.algorithm,
        "confidence": spec.confidence,
        "confidence_suppression": "applied" if spec.scale_basis == "diameter" else "not applied (bounds mode)",
        "suppression_budget": spec.suppression_budget,
        "scale_basis": spec.scale_basis,
        "mechanism": "laplace",
        "privacy_unit": "record",
        "e_quasi": {
            q.column: {"lower": q.lower, "upper": q.upper, "grid": grids[q.column], "out_of_bounds": q.out_of_bounds}
            for q in spec.roles.e_quasi
        },
    }
    if spec.algorithm == "ola":
        method["ola_metric"] = spec.ola_metric
    # Declared parameters, like k: the criteria enforced and the risk limits the gate applied. The
    # figures the groups achieve (ℓ, t, homogeneous groups, risks) stay in the private record.
    if spec.roles.sensitive_criteria():
        method["sensitive_criteria"] = spec.roles.sensitive_criteria()
    method["max_linking_risk"] = spec.max_linking_risk
    if spec.max_prosecutor_risk is not None:
        method["max_prosecutor_risk"] = spec.max_prosecutor_risk
    records: PublicRecords = {"in": record["rows_in"], "removed": dict(record["rows_removed"]), "published": record["rows_published"]}
    document = _public_document(record, spec, method, guarantee, records)
    opted_in = _unprotected_statistics(record, spec.publish_statistics)
    if opted_in:
        document["unprotected_statistics"] = opted_in
    check_public_fields(document)
    return document


def dp_public_manifest(record: ReleaseRecord, spec: ReleaseSpec, guarantee: str) -> PublicManifest:
    """The DP mode's public manifest: its guarantee, its parameters, and only outputs of the mechanism.

    Counts: the published records and groups, which are functions of the published table. Not the
    records read, sampled or suppressed: they depend on the source (its size above all), which the
    (ε, δ) guarantee does not cover, so they stay in the private record.
    """
    method: PublicMethod = {
        "name": DP_METHOD_NAME,
        "privacy_model": "dp",
        "k": spec.k,
        "epsilon": spec.epsilon,
        "dp": record["dp"].copy(),
        "algorithm": record["algorithm"],
        "mechanism": record["mechanism"],
        "privacy_unit": "record",
        "neighbouring_relation": DP_NEIGHBOURS,
    }
    if spec.max_prosecutor_risk is not None:
        method["max_prosecutor_risk"] = spec.max_prosecutor_risk
    document = _public_document(record, spec, method, guarantee, {"published": record["rows_published"]})
    check_public_fields(document)
    return document


def _public_document(
    record: ReleaseRecord, spec: ReleaseSpec, method: PublicMethod, guarantee: str, records: PublicRecords
) -> PublicManifest:
    """The fields every public manifest carries, around its mode's ``method`` and record ``records`` counts."""
    return {
        "release_id": spec.release_id,
        "population_id": spec.population_id,
        "method": method,
        "roles": spec.roles.names(),
        "columns": {name: dict(entry) for name, entry in record["columns"].items()},
        "hierarchies": hierarchy_descriptions(spec, record.get("hierarchies", {})),
        "guarantee": guarantee,
        "records": records,
        "groups": {"published": record["groups"]["published"], "smallest": record["groups"]["smallest"]},
        "software": dict(record["software"]),
        "checks": [{"name": c["name"], "success": bool(c["success"])} for c in record.get("checks", [])],
    }


def _unprotected_statistics(record: ReleaseRecord, names: Sequence[str]) -> dict[str, Any]:
    loss = record.get("information_loss", {})
    disclosure = record.get("disclosure", {})
    available = {
        "disclosure": {
            key: disclosure.get(key)
            for key in ("l_diversity_min", "t_closeness_max", "homogeneous_groups", "prosecutor_risk")
        },
        "information_loss": {"measured": loss.get("measured"), "predicted": loss.get("predicted")},
        "linking_risk": record.get("linking_risk"),
        "k_quasi_precision": loss.get("k_quasi_precision"),
    }
    return {name: available[name] for name in names}


def published_groups(frame, k_quasi: list[str], n_in: int) -> dict:
    """Group figures of the published table itself: records sharing all their k-quasi labels are
    one group, however many of the anonymiser's classes they came from.

    ``discernibility`` charges every record removed at any stage ``n_in`` (private record only).
    """
    return groups_from_sizes(frame.groupby(k_quasi, sort=False, dropna=False).size().to_numpy(), n_in)


def groups_from_sizes(sizes, n_in: int) -> dict:
    """:func:`published_groups` from the published groups' sizes (any order)."""
    values, counts = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    return groups_from_size_counts(values, counts, n_in)


def groups_from_size_counts(values, counts, n_in: int) -> dict:
    """:func:`published_groups` from a frequency of frequencies of the published groups' sizes (``counts[i]``
    groups of ``values[i]`` records), as a partitioned release adds them up: integers throughout, so exact."""
    values = [int(v) for v in np.asarray(values, dtype=np.int64)]
    counts = [int(c) for c in np.asarray(counts, dtype=np.int64)]
    removed = n_in - sum(v * c for v, c in zip(values, counts))
    return {
        "published": sum(counts),
        "smallest": min(values) if values else 0,
        "largest": max(values) if values else 0,
        "discernibility": sum(v * v * c for v, c in zip(values, counts)) + removed * n_in,
    }
