"""Shared fixtures: paths to the bundled data and a small, valid release spec."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "data" / "paper-synthetic"
ADULT = ROOT / "data" / "adult"


@pytest.fixture
def synthetic_spec_dict(tmp_path) -> dict:
    """The paper-synthetic release as a mapping, publishing under a temporary folder."""
    hierarchies = SYNTHETIC / "hierarchies"
    return {
        "release_id": "test-release",
        "population_id": "test-population",
        "source": {"path": str(SYNTHETIC / "people.csv"), "delimiter": ";"},
        "roles": {
            "explicit": ["ID", "NAME", "SURNAME", "EMAIL", "ZIP", "WEIGHT"],
            "k_quasi": [
                {"column": c, "hierarchy": str(hierarchies / f"{c}.csv")}
                for c in ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
            ],
            "e_quasi": [{"column": "HEIGHT", "lower": 130, "upper": 210}],
            "sensitive": ["RELIGION", "ICD"],
        },
        "k": 10,
        "epsilon": 1.0,
        "confidence": 0.99,
        "suppression_budget": 0.05,
        "output_dir": str(tmp_path / "out"),
    }
