"""The release spec: validation errors name the parameter; YAML paths resolve against the spec file."""

from pathlib import Path

import pytest
import yaml

from kepsilon.flows.spec import load_spec, parse_spec
from kepsilon.tasks.errors import SpecError

from .conftest import ROOT


def test_shipped_specs_load_and_point_at_bundled_data():
    for name in ["paper-synthetic", "adult"]:
        spec = load_spec(ROOT / "releases" / f"{name}.yaml")
        assert Path(spec.source.path).is_relative_to((ROOT / "data").resolve())
        assert Path(spec.source.path).is_file()
        for quasi in spec.roles.k_quasi:
            assert Path(quasi.hierarchy).is_file()


@pytest.mark.parametrize(
    "change, parameter",
    [
        ({"k": 1}, "k"),
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": -1}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"confidence": 1.0}, "confidence"),
        ({"suppression_budget": 1.5}, "suppression_budget"),
        ({"algorithm": "datafly"}, "algorithm"),
        ({"surprise": 1}, "surprise"),
        ({"release_id": "../escape"}, "release_id"),
    ],
)
def test_bad_parameters_are_named(synthetic_spec_dict, change, parameter):
    with pytest.raises(SpecError) as raised:
        parse_spec({**synthetic_spec_dict, **change})
    assert raised.value.parameter == parameter


def test_a_column_with_two_roles_is_refused(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["sensitive"].append("HEIGHT")
    with pytest.raises(SpecError, match="HEIGHT"):
        parse_spec(synthetic_spec_dict)


def test_bounds_must_be_ordered(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["e_quasi"] = [{"column": "HEIGHT", "lower": 210, "upper": 130}]
    with pytest.raises(SpecError, match="HEIGHT.*lower bound must be below"):
        parse_spec(synthetic_spec_dict)


@pytest.mark.parametrize("scale_basis", ["diameter", "bounds"])
def test_every_e_quasi_needs_public_bounds(synthetic_spec_dict, scale_basis):
    # The bounds set the plausibility range and the public snapping grid in both bases.
    synthetic_spec_dict["roles"]["e_quasi"] = [{"column": "HEIGHT"}]
    synthetic_spec_dict["scale_basis"] = scale_basis
    with pytest.raises(SpecError, match="HEIGHT.*needs public lower and upper bounds"):
        parse_spec(synthetic_spec_dict)


def test_a_k_quasi_without_hierarchy_is_refused_by_name(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["k_quasi"][0] = {"column": "YOB"}
    with pytest.raises(SpecError, match="k-quasi 'YOB' needs a hierarchy"):
        parse_spec(synthetic_spec_dict)


def test_a_k_quasi_may_use_a_hierarchy_builder(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["k_quasi"][0] = {
        "column": "YOB",
        "hierarchy": {"kind": "intervals", "lower": 1900, "upper": 2030, "widths": [5, 10, 50]},
    }
    spec = parse_spec(synthetic_spec_dict)
    assert spec.roles.k_quasi[0].hierarchy.widths == [5, 10, 50]


def test_epsilon_split_follows_shares(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["explicit"].remove("WEIGHT")
    synthetic_spec_dict["roles"]["e_quasi"].append({"column": "WEIGHT", "lower": 30, "upper": 200, "epsilon_share": 3})
    spec = parse_spec(synthetic_spec_dict)
    assert spec.epsilon_split() == pytest.approx({"HEIGHT": 0.25, "WEIGHT": 0.75})


def test_spec_hash_ignores_operator_and_output_dir_but_not_k(synthetic_spec_dict):
    base = parse_spec(synthetic_spec_dict)
    assert parse_spec({**synthetic_spec_dict, "operator": "someone"}).spec_hash() == base.spec_hash()
    # Where files are written does not change the released data: a corrected folder is the same release.
    assert parse_spec({**synthetic_spec_dict, "output_dir": "elsewhere"}).spec_hash() == base.spec_hash()
    assert parse_spec({**synthetic_spec_dict, "k": 11}).spec_hash() != base.spec_hash()


def test_date_placeholder(synthetic_spec_dict):
    spec = parse_spec({**synthetic_spec_dict, "release_id": "nightly-{date}"})
    assert spec.for_date("2026-11-21").release_id == "nightly-2026-11-21"


def test_run_placeholder_gives_each_run_its_own_release_id(synthetic_spec_dict):
    spec = parse_spec({**synthetic_spec_dict, "release_id": "custom-{date}-{run}"})
    assert spec.for_run("2026-11-21", "clever-fox").release_id == "custom-2026-11-21-clever-fox"
    assert spec.for_run("2026-11-21", "odd name/..").release_id == "custom-2026-11-21-odd-name"


def test_the_deployment_form_default_is_unique_per_run():
    from .conftest import ROOT

    deployments = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text(encoding="utf-8"))["deployments"]
    releases = [d for d in deployments if "spec" in d["parameters"]]  # the advise deployment publishes nothing
    assert releases
    for deployment in releases:
        release_id = deployment["parameters"]["spec"]["release_id"]
        assert "{date}" in release_id and "{run}" in release_id, deployment["name"]


def test_yaml_overrides_and_relative_paths(tmp_path, synthetic_spec_dict):
    (tmp_path / "data.csv").write_text("a;b\n1;2\n")
    synthetic_spec_dict["source"]["path"] = "data.csv"
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(synthetic_spec_dict))
    spec = load_spec(tmp_path / "spec.yaml", k=5, epsilon=None)
    assert spec.k == 5 and spec.epsilon == 1.0
    assert spec.source.path == str((tmp_path / "data.csv").resolve())


def test_not_yaml_is_refused(tmp_path):
    (tmp_path / "spec.yaml").write_text("k: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "spec.yaml")


def test_certificate_fields_name_columns_and_leave_the_spec_hash_alone_when_unset(synthetic_spec_dict):
    from kepsilon.flows.spec import parse_spec
    from kepsilon.tasks.errors import SpecError

    base = parse_spec(synthetic_spec_dict)
    assert parse_spec({**synthetic_spec_dict, "population": None, "certificate": None}).spec_hash() == base.spec_hash()
    assert parse_spec({**synthetic_spec_dict, "max_journalist_risk": 0.2}).spec_hash() != base.spec_hash()
    with pytest.raises(SpecError, match="certificate.utility_target"):
        parse_spec({**synthetic_spec_dict, "certificate": {"utility_target": "NAME"}})  # explicit: not released
    with pytest.raises(SpecError, match="population.weight_column"):
        parse_spec({**synthetic_spec_dict, "population": {"weight_column": "WEIGHT"}})  # explicit: removed first
    with pytest.raises(SpecError, match="population"):
        parse_spec({**synthetic_spec_dict, "population": {"sampling_fraction": 0.1, "table": "p.csv"}})
    # On the Dask engine the gates are computed by the class partitions (issue 27), with sampling weights too
    # (tests/test_certificate_engines.py compares their figures with the memory engine's).
    on_dask = parse_spec({**synthetic_spec_dict, "max_marketer_risk": 0.1, "execution": {"engine": "dask"}})
    assert on_dask.max_marketer_risk == 0.1
    weighted = parse_spec({**synthetic_spec_dict, "max_journalist_risk": 0.1, "execution": {"engine": "dask"},
                           "population": {"weight_column": "HEIGHT"}})
    assert weighted.population.weight_column == "HEIGHT" and weighted.max_journalist_risk == 0.1
