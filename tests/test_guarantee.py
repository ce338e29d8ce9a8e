"""One guarantee object per release: the published statement, the manifest's DP figures and the ledger's
charge all come from ``kepsilon.guarantee.Guarantee`` and agree on a real release of each mode.

The checks read what users read: the published ``manifest.json``, the private record the flow returns and
the population's budget in the audit store after the release.
"""

import json
from pathlib import Path

import pytest

from kepsilon.audit.ledger import budget, set_cap
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec
from kepsilon.guarantee import DPParameters, Guarantee

from .conftest import capped_store, release_spec_dict
from .test_dp_flow import dp_spec

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

NANO = 10**9
ATTO = 10**18


def manifest_of(spec) -> dict:
    return json.loads((Path(spec.output_dir) / spec.release_id / "manifest.json").read_text(encoding="utf-8"))


def test_a_dp_release_states_publishes_and_charges_the_same_guarantee(tmp_path, monkeypatch):
    db = capped_store(tmp_path, monkeypatch, "dp-population")
    set_cap(db, "dp-population", 5.0, by="test-officer", reason="test caps", delta=0.01)
    spec = parse_spec(dp_spec(tmp_path))
    record = governed_release(spec)
    manifest = manifest_of(spec)

    guarantee = Guarantee.for_spec(spec)
    assert manifest["guarantee"] == guarantee.statement() == Guarantee.from_record(record).statement()
    published = manifest["method"]["dp"]
    assert {name: published[name] for name in guarantee.parameters()} == guarantee.parameters()
    spent = budget(db, "dp-population")
    assert guarantee.charge() == (1.0, spec.dp_delta())
    assert spent["dp_epsilon"] == round(guarantee.charge().epsilon * NANO)
    assert spent["dp_delta"] == pytest.approx(guarantee.charge().delta * ATTO, rel=1e-9)


def test_a_kepsilon_release_states_its_scale_basis_and_charges_epsilon_only(tmp_path, monkeypatch):
    db = capped_store(tmp_path, monkeypatch, "guarantee-people")
    spec = parse_spec(release_spec_dict("paper-synthetic", release_id="guarantee", population_id="guarantee-people",
                                        output_dir=str(tmp_path / "out"), scale_basis="bounds"))
    record = governed_release(spec)
    manifest = manifest_of(spec)

    guarantee = Guarantee.for_spec(spec)
    assert manifest["guarantee"] == guarantee.statement() == Guarantee.from_record(record).statement()
    assert "Noise scale from public bounds" in manifest["guarantee"] and guarantee.parameters() == {}
    assert guarantee.charge() == (spec.epsilon, None)
    spent = budget(db, "guarantee-people")
    assert (spent["kepsilon_epsilon"], spent["dp_delta"]) == (round(spec.epsilon * NANO), 0)


def test_a_guarantee_with_figures_of_the_other_mode_is_refused():
    with pytest.raises(ValueError, match="exactly when its model is dp"):
        Guarantee("kepsilon", 5, 1.0, scale_basis="diameter", dp=DPParameters(0, 1, 0.6, 1e-7))
    with pytest.raises(ValueError, match="exactly when its model is dp"):
        Guarantee("dp", 5, 1.0)
