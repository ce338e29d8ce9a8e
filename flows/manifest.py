"""The release manifest: what a release was, in one JSON document, with no data values in it.

The same document is published next to the data (``manifest.json``) and normalised into the audit
store, so the published file and the audit record cannot disagree.
"""

import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import kepsilon
from kepsilon.flows.spec import ReleaseSpec

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


def software_versions() -> dict:
    """Versions of kepsilon, Python and the main libraries, and the git commit when there is one."""
    versions = {"kepsilon": kepsilon.__version__, "python": platform.python_version()}
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


def base_manifest(spec: ReleaseSpec, source_report: dict, key: str) -> dict:
    """The part of the manifest known before any stage runs: identity and parameters."""
    return {
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
        "roles": spec.roles.names(),
        "source": {"path": spec.source.path, **source_report},
        "rows_in": source_report["rows"],
        "software": software_versions(),
    }
