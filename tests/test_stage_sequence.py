"""The in-memory release publishes exactly what ``preview()`` computes with the release's own seed.

``preview(frame, spec, seed)`` (kepsilon/engine/preview.py) is the engine's stage sequence without
governance; the flow runs the same stages as tasks around the reservation. The published ``data.csv``
must equal, byte for byte, the preview's table written the same way with the seed the flow sealed and
an officer unseals — for the method's diameter and bounds modes and for both anonymisers.
"""

from pathlib import Path

import pytest

from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import ReleaseSpec

from .conftest import capped_store, release_spec_dict
from .test_dask_release import in_memory, unsealed_seed

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]


@pytest.mark.parametrize("changes", [{}, {"scale_basis": "bounds"}, {"algorithm": "ola"}],
                         ids=["diameter", "bounds", "ola"])
def test_the_published_data_equals_the_preview_with_the_unsealed_seed(tmp_path, monkeypatch, changes):
    store = capped_store(tmp_path, monkeypatch, "stage-people")
    spec = ReleaseSpec.model_validate(release_spec_dict(
        "paper-synthetic", release_id="stages", population_id="stage-people", output_dir=str(tmp_path / "out"),
        **changes))
    record = governed_release(spec)
    published = (Path(spec.output_dir) / spec.release_id / "data.csv").read_bytes()

    released, expected, preview = in_memory(spec, unsealed_seed(store, spec.release_id))
    assert published == expected
    assert record["rows_published"] == len(released) > 0
    assert record["rows_removed"] == preview.metrics["rows_removed"]
