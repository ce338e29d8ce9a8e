"""The DP mode through the governed flow: published, no group below k, its (ε, δ) stated and recorded.

UCI Adult with five generalised columns (a lattice of 240 nodes) and salary-class released as read; the
other three columns are removed (explicit). Every check reads what a user sees: the published files (k by
an independent group count over every released column), the manifest, and the audit store.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from kepsilon.audit.ledger import BudgetExceeded, budget, mark_noise_drawn, reserve, set_cap
from kepsilon.flows.manifest import check_public_fields
from kepsilon.flows.release import governed_release
from kepsilon.flows.spec import parse_spec

from .conftest import ADULT, capped_store

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]

RELEASED = ["sex", "age", "race", "marital-status", "education", "salary-class"]
NODE = {"sex": 0, "race": 1, "marital-status": 1, "education": 2, "age": 2}


def dp_spec(tmp_path, **changes) -> dict:
    spec = {
        "release_id": "dp-release",
        "population_id": "dp-population",
        "source": {"path": str(ADULT / "adult.csv"), "delimiter": ";"},
        "roles": {
            "explicit": ["native-country", "workclass", "occupation"],
            "k_quasi": [{"column": c, "hierarchy": str(ADULT / f"adult_hierarchy_{c}.csv")}
                        for c in ["sex", "race", "marital-status", "education"]],
            "e_quasi": [{"column": "age", "hierarchy": {"kind": "intervals", "lower": 0, "upper": 100,
                                                        "widths": [5, 10, 20, 40]}}],
            "sensitive": ["salary-class"],
        },
        "privacy_model": "dp",
        "k": 30,
        "epsilon": 1.0,
        "dp": {"max_delta": 0.002, "node": dict(NODE)},
        "output_dir": str(tmp_path / "out"),
    }
    spec.update(changes)
    return spec


@pytest.fixture
def store(tmp_path, monkeypatch):
    db = capped_store(tmp_path, monkeypatch, "dp-population")
    set_cap(db, "dp-population", 5.0, by="test-officer", reason="test caps", delta=0.01)
    return db


def published(spec: dict) -> tuple[dict, pd.DataFrame, Path]:
    directory = Path(spec["output_dir"]) / spec["release_id"]
    manifest = json.loads((directory / "manifest.json").read_text())
    return manifest, pd.read_csv(directory / "data.csv", dtype=str, keep_default_na=False), directory


def audit_answer(store_path, *arguments) -> list[dict]:
    """An officer's question through the real CLI, as JSON."""
    from typer.testing import CliRunner

    from kepsilon.cli import app

    result = CliRunner().invoke(app, ["audit", "--db", str(store_path), *arguments, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_dp_release_publishes_no_group_below_k_states_its_guarantee_and_records_delta(store, tmp_path):
    spec = parse_spec(dp_spec(tmp_path))
    record = governed_release(spec)
    manifest, data, _ = published(dp_spec(tmp_path))

    assert list(data.columns) == RELEASED
    assert data.groupby(RELEASED).size().min() >= 30  # independent count, every released column in the key
    assert set(data["age"]) <= {f"[{a}, {a + 10})" for a in range(0, 90, 10)} | {"[90, 100]"}  # age at level 2
    assert len(data) == manifest["records"]["published"] == record["rows_published"]
    assert manifest["records"] == {"published": len(data)}  # nothing counted from the source
    assert manifest["groups"] == {"published": data.groupby(RELEASED).ngroups,
                                  "smallest": int(data.groupby(RELEASED).size().min())}
    check_public_fields(manifest)
    method = manifest["method"]
    assert method["privacy_model"] == "dp" and method["k"] == 30 and method["epsilon"] == 1.0
    assert method["dp"]["node"] == NODE and method["dp"]["node_chosen_by"] == "spec"
    assert method["dp"]["epsilon_search"] == 0 and method["dp"]["epsilon_anonymisation"] == 1.0
    assert method["dp"]["beta"] == pytest.approx(0.6321, abs=1e-4)
    assert method["dp"]["delta"] == pytest.approx(spec.dp_delta()) and spec.dp_delta() < 0.002
    assert f"(1, {spec.dp_delta():.3g})-differential privacy" in manifest["guarantee"]
    assert all(check["success"] for check in manifest["checks"])
    assert "suppression_within_budget" not in {check["name"] for check in manifest["checks"]}
    assert set(manifest["hierarchies"]) == {"sex", "race", "marital-status", "education", "age"}
    # The source's size stays private: neither the records read nor those sampled or suppressed.
    assert str(record["rows_in"]) not in json.dumps(manifest)
    assert record["rows_in"] == 30162 and record["rows_removed"]["sampling"] > 0

    (row,) = list(store["releases"].rows)
    assert (row["privacy_model"], row["outcome"]) == ("dp", "published")
    assert row["delta"] == pytest.approx(spec.dp_delta())
    reserved = store.execute("SELECT atto_delta FROM ledger WHERE kind = 'reserve'").fetchone()[0]
    assert reserved == pytest.approx(spec.dp_delta() * 1e18, rel=1e-9)
    state = budget(store, "dp-population")
    assert (state["dp_epsilon"], state["kepsilon_epsilon"]) == (10**9, 0)


def test_a_searched_node_is_published_and_a_rerun_re_derives_the_same_bytes(store, tmp_path, monkeypatch):
    import kepsilon.tasks.publish as publish_module
    from kepsilon.tasks.errors import ReleaseFailed

    search = dp_spec(tmp_path, dp={"max_delta": 0.002, "search": {"epsilon": 0.2}}, k=28)
    real_stage, staged = publish_module.stage, []

    def stage_then_fail(frame, manifest, output_dir):
        staged.append(real_stage(frame, manifest, output_dir))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish_module, "stage", stage_then_fail)
    with pytest.raises(ReleaseFailed, match="No space left"):
        governed_release(parse_spec(search))
    first = {name: (staged[0].staging / name).read_bytes() for name in ["data.csv", "data.parquet", "manifest.json"]}
    monkeypatch.setattr(publish_module, "stage", real_stage)

    record = governed_release(parse_spec(search))  # same idempotency key: same reservation, same seed
    manifest, data, directory = published(search)
    assert {name: (directory / name).read_bytes() for name in first} == first  # byte for byte
    assert record["budget"]["reused"] is True
    assert store.execute("SELECT COUNT(*) FROM ledger WHERE kind IN ('reserve', 'spend')").fetchone()[0] == 2
    node = manifest["method"]["dp"]["node"]
    assert node == record["dp"]["node"] and set(node) == {"sex", "race", "marital-status", "education", "age"}
    assert manifest["method"]["dp"]["node_chosen_by"].startswith("exponential mechanism")
    assert manifest["method"]["dp"]["epsilon_search"] == 0.2
    assert manifest["method"]["dp"]["epsilon_anonymisation"] == pytest.approx(0.8)
    assert data.groupby(RELEASED).size().min() >= 28


def test_a_delta_cap_refuses_before_any_sample_is_drawn(store, tmp_path):
    set_cap(store, "dp-population", 5.0, by="test-officer", reason="tight δ", delta=1e-4)
    with pytest.raises(BudgetExceeded, match="δ"):
        governed_release(parse_spec(dp_spec(tmp_path)))
    assert store.execute("SELECT COUNT(*) FROM ledger WHERE kind IN ('reserve', 'spend')").fetchone()[0] == 0
    assert store.execute("SELECT COUNT(*) FROM sealed_seeds").fetchone()[0] == 0  # no seed, no sample
    (row,) = list(store["releases"].rows)
    assert row["outcome"] == "refused" and "δ" in row["failure_reason"]
    assert not (tmp_path / "out" / "dp-release").exists()


def test_a_node_level_out_of_range_is_refused_by_name_before_any_epsilon(store, tmp_path):
    from kepsilon.tasks.errors import SpecError

    spec = dp_spec(tmp_path, dp={"max_delta": 0.002, "node": {**NODE, "education": 4}})
    with pytest.raises(SpecError, match=r"'dp.node.education': level 4 is outside its hierarchy's levels 0..3"):
        governed_release(parse_spec(spec))
    assert store.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 0


def test_the_dp_total_never_includes_a_release_of_the_method_s_own_mode(store, tmp_path):
    kepsilon_mode = reserve(store, population_id="dp-population", epsilon=0.5, idempotency_key="own-mode",
                            release_id="own", operator="op")
    mark_noise_drawn(store, kepsilon_mode.id)
    governed_release(parse_spec(dp_spec(tmp_path)))
    state = budget(store, "dp-population")
    assert state["in_use"] == 15 * 10**8  # both count against the ε cap
    assert (state["dp_epsilon"], state["kepsilon_epsilon"]) == (10**9, 5 * 10**8)
    (answer,) = audit_answer(tmp_path / "audit.db", "budget", "dp-population")
    assert (answer["dp_epsilon"], answer["kepsilon_mode_epsilon"], answer["spent_lifetime"]) == (1.0, 0.5, 1.5)
    assert answer["dp_delta"] == pytest.approx(parse_spec(dp_spec(tmp_path)).dp_delta())
    assert answer["delta_cap"] == 0.01
