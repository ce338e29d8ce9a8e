"""Shared fixtures: paths to the bundled data and a small, valid release spec."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYNTHETIC = ROOT / "data" / "paper-synthetic"
ADULT = ROOT / "data" / "adult"


def release_spec_dict(name: str, **changes) -> dict:
    """A shipped release spec (``releases/<name>.yaml``) as a mapping with absolute paths, changed as asked."""
    from kepsilon.flows.spec import load_spec

    spec = load_spec(ROOT / "releases" / f"{name}.yaml").model_dump(mode="json")
    spec.update(changes)
    return spec


@pytest.fixture
def synthetic_spec_dict(tmp_path) -> dict:
    """The shipped paper-synthetic release, under test names, publishing under a temporary folder."""
    return release_spec_dict(
        "paper-synthetic", release_id="test-release", population_id="test-population", output_dir=str(tmp_path / "out")
    )
