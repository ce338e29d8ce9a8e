"""The DP mode's spec and plan: every parameter the theorem does not cover is refused by name before any
ε is reserved, and the method's own mode is unchanged (its specs keep their hashes)."""

import pandas as pd
import pytest

from kepsilon.engine.dp import safe_k_delta, sampling_rate_for, smallest_k
from kepsilon.engine.dp_release import dp_generators, mechanism, plan
from kepsilon.flows.spec import parse_spec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.errors import InputError, SpecError

from .conftest import ADULT


def dp_dict(**changes) -> dict:
    spec = {
        "release_id": "dp-release",
        "population_id": "dp-population",
        "source": {"path": str(ADULT / "adult.csv"), "delimiter": ";"},
        "roles": {
            "explicit": ["native-country", "workclass", "occupation"],
            "k_quasi": [{"column": c, "hierarchy": str(ADULT / f"adult_hierarchy_{c}.csv")}
                        for c in ["sex", "race", "marital-status", "education"]],
            "e_quasi": [{"column": "age", "hierarchy": str(ADULT / "adult_hierarchy_age.csv")}],
            "sensitive": ["salary-class"],
        },
        "privacy_model": "dp",
        "k": 30,
        "epsilon": 1.0,
        "dp": {"max_delta": 0.002, "node": {"sex": 0, "race": 1, "marital-status": 1, "education": 2, "age": 2}},
    }
    spec.update(changes)
    return spec


def with_dp(**dp) -> dict:
    return dp_dict(dp={**dp_dict()["dp"], **dp})


def test_the_guarantee_s_parameters_follow_from_the_spec():
    spec = parse_spec(with_dp(node=None, search={"epsilon": 0.2}))
    assert spec.dp_epsilons() == (0.2, 0.8)
    assert spec.dp_beta() == sampling_rate_for(0.8)
    assert spec.dp_delta() == safe_k_delta(30, sampling_rate_for(0.8), 0.8)
    assert spec.epsilon_split() == {}  # nothing is noised
    given = parse_spec(with_dp(beta=0.3))
    assert given.dp_beta() == 0.3 and given.dp_delta() == safe_k_delta(30, 0.3, 1.0)


@pytest.mark.parametrize(
    "changes, parameter, message",
    [
        (with_dp(node=None, search={"epsilon": 1.0}), "dp.search.epsilon", "below the release's epsilon"),
        (with_dp(beta=0.7), "dp.beta", r"needs ε_anon ≥ −ln\(1 − β\) = 1.204"),
        (with_dp(max_delta=1e-6), "dp.max_delta", f"the smallest k that meets it .* is {smallest_k(1e-6, sampling_rate_for(1.0), 1.0)}"),
        (with_dp(node={"sex": 0, "race": 1, "marital-status": 1, "education": 2}), "dp.node.age", "needs a level"),
        (with_dp(node={**dp_dict()["dp"]["node"], "salary-class": 0}), "dp.node.salary-class", "not a k-quasi or ε-quasi"),
        (with_dp(sensitive_levels={"salary-class": 1}), "dp.sensitive_levels.salary-class", "needs the column's `hierarchy`"),
        (with_dp(sensitive_levels={"sex": 0}), "dp.sensitive_levels.sex", "not a sensitive column"),
        (dp_dict(algorithm="ola"), "algorithm", "does not apply to privacy_model dp"),
        (dp_dict(suppression_budget=0.1), "suppression_budget", "whatever their number"),
        (dp_dict(scale_basis="bounds"), "scale_basis", "nothing is noised"),
        (dp_dict(confidence=0.9), "confidence", "confidence suppression"),
        (dp_dict(max_linking_risk=0.2), "max_linking_risk", "does not apply"),
        (dp_dict(publish_statistics=["linking_risk"]), "publish_statistics", "no statistic"),
        (dp_dict(dp=None), "dp", "needs its parameters"),
        (dp_dict(privacy_model="kepsilon"), "dp", "applies to privacy_model dp only"),
        (dp_dict(execution={"engine": "dask"}), "execution.engine", "runs in memory only"),
        # Field errors under a validated model are named by the spec's own path, not pydantic's validator tags.
        (with_dp(max_delta=2), "dp.max_delta", "less than 1"),
        (with_dp(node=None, search={"epsilon": 0.1, "quality": "bogus"}), "dp.search.quality", "Input should be"),
    ],
)
def test_a_parameter_outside_the_theorem_is_refused_by_name(changes, parameter, message):
    with pytest.raises(SpecError, match=message) as refused:
        parse_spec(changes)
    assert refused.value.parameter == parameter


def test_roles_the_dp_mode_cannot_release_are_refused_by_name():
    spec = dp_dict()
    spec["roles"]["e_quasi"] = [{"column": "age", "lower": 17, "upper": 90}]
    with pytest.raises(SpecError, match="'roles.e_quasi.age'.*public `hierarchy`"):
        parse_spec(spec)
    spec["roles"]["e_quasi"] = [{"column": "age", "lower": 17, "upper": 90, "hierarchy": str(ADULT / "adult_hierarchy_age.csv")}]
    with pytest.raises(SpecError, match="'roles.e_quasi.age'.*noise of privacy_model kepsilon"):
        parse_spec(spec)
    spec = dp_dict()
    spec["roles"]["sensitive"] = [{"column": "salary-class", "l_diversity": {"l": 2}}]
    with pytest.raises(SpecError, match="'roles.sensitive.salary-class'.*single value"):
        parse_spec(spec)
    with pytest.raises(SpecError, match="node.*search.*not both"):
        parse_spec(with_dp(search={"epsilon": 0.1}))
    with pytest.raises(SpecError, match="steps applies to strategy walk only"):
        parse_spec(with_dp(node=None, search={"epsilon": 0.1, "steps": 3}))


# Every field of the method's own mode, at its default value: stating it in a DP spec is refused all the same
# (before the split, the defaults passed and only another value was refused).
DEFAULTS_OF_THE_METHODS_MODE = {
    "algorithm": "mondrian",
    "ola_metric": "precision",
    "scale_basis": "diameter",
    "confidence": 0.99,
    "suppression_budget": 0.05,
    "max_linking_risk": 0.10,
    "max_journalist_risk": 0.5,
    "max_marketer_risk": 0.5,
    "publish_statistics": [],
}


@pytest.mark.parametrize("field, value", DEFAULTS_OF_THE_METHODS_MODE.items())
def test_a_field_of_the_method_s_own_mode_is_refused_in_a_dp_spec_whatever_its_value(field, value):
    with pytest.raises(SpecError, match="does not apply to privacy_model dp") as refused:
        parse_spec(dp_dict(**{field: value}))
    assert refused.value.parameter == field
    assert str(value) not in str(refused.value).replace(field, "")


@pytest.mark.parametrize("field, value", [("out_of_bounds", "refuse"), ("max_relative_error", 0.2), ("epsilon_share", 1.0)])
def test_an_e_quasi_s_noise_field_is_refused_in_a_dp_spec_whatever_its_value(field, value):
    spec = dp_dict()
    spec["roles"]["e_quasi"][0][field] = value
    with pytest.raises(SpecError, match=f"`{field}` applies to the noise of privacy_model kepsilon only") as refused:
        parse_spec(spec)
    assert refused.value.parameter == "roles.e_quasi.age"


def test_a_dp_block_in_a_kepsilon_spec_is_refused_whatever_it_holds(synthetic_spec_dict):
    synthetic_spec_dict["dp"] = dp_dict()["dp"]
    with pytest.raises(SpecError, match="applies to privacy_model dp only") as refused:
        parse_spec(synthetic_spec_dict)
    assert refused.value.parameter == "dp"


def test_a_field_left_empty_counts_as_not_stated(synthetic_spec_dict):
    # What the run form sends for an empty field is "not given", in either privacy model.
    spec = parse_spec(dp_dict(confidence=None, algorithm="", max_journalist_risk=None))
    assert spec.privacy_model == "dp"
    assert parse_spec({**synthetic_spec_dict, "dp": None}).dp is None


def test_a_dp_spec_read_back_from_its_dump_is_the_same_spec_with_the_same_hash():
    # Prefect stores the flow's parameter as its JSON dump, and resolve_paths validates a dump again.
    spec = parse_spec(with_dp(node=None, search={"epsilon": 0.2}))
    dumped = spec.model_dump(mode="json")
    assert not set(DEFAULTS_OF_THE_METHODS_MODE) & set(dumped)
    assert "out_of_bounds" not in dumped["roles"]["e_quasi"][0]
    again = parse_spec(dumped)
    assert again == spec and again.spec_hash() == spec.spec_hash()


DP_HASH_BEFORE_THE_SPLIT = "75f574c2d54dbe15d7912be6ef3cb8d13401dc78446acf36e3ed7e5731282f41"


def test_a_dp_spec_keeps_the_hash_it_had_before_the_split():
    # Computed by the code before the privacy models were split: a DP release's approvals stay valid.
    spec = {
        "release_id": "pinned", "population_id": "pop", "source": {"path": "/data/people.csv"},
        "roles": {"k_quasi": [{"column": "YOB", "hierarchy": "/data/YOB.csv"}],
                  "e_quasi": [{"column": "HEIGHT", "hierarchy": "/data/HEIGHT.csv"}], "sensitive": ["ICD"]},
        "privacy_model": "dp", "k": 30, "epsilon": 1.0,
        "dp": {"max_delta": 0.01, "node": {"YOB": 1, "HEIGHT": 0}},
    }
    assert parse_spec(spec).spec_hash() == DP_HASH_BEFORE_THE_SPLIT


def test_an_e_quasi_hierarchy_in_the_method_s_own_mode_is_refused(synthetic_spec_dict):
    synthetic_spec_dict["roles"]["e_quasi"][0]["hierarchy"] = "HEIGHT.csv"
    with pytest.raises(SpecError, match="'roles.e_quasi.HEIGHT.hierarchy': applies to privacy_model dp only"):
        parse_spec(synthetic_spec_dict)


def test_the_method_s_own_specs_keep_their_hash():
    # Computed by the code before the DP mode existed: approvals and idempotency keys stay valid.
    spec = {
        "release_id": "pinned", "population_id": "pop",
        "source": {"path": "/data/people.csv", "delimiter": ";"},
        "roles": {"explicit": ["ID"], "k_quasi": [{"column": "YOB", "hierarchy": "/data/YOB.csv"}],
                  "e_quasi": [{"column": "HEIGHT", "lower": 130, "upper": 210}], "sensitive": ["ICD"]},
        "k": 10, "epsilon": 1.0,
    }
    assert parse_spec(spec).spec_hash() == "8f2724efe0aaeb671706ab86bffc72a1624273c40a65a2b355928357c5c0620e"
    assert parse_spec(dp_dict()).spec_hash() != parse_spec(with_dp(max_delta=0.003)).spec_hash()


@pytest.fixture(scope="module")
def adult() -> pd.DataFrame:
    return pd.read_csv(ADULT / "adult.csv", sep=";", dtype="string", keep_default_na=False)


def test_the_plan_refuses_before_any_epsilon_what_the_hierarchies_forbid(adult):
    spec = parse_spec(with_dp(node={"sex": 0, "race": 2, "marital-status": 1, "education": 2, "age": 2}))
    table = classify(adult, spec)
    with pytest.raises(SpecError, match=r"'dp.node.race': level 2 is outside its hierarchy's levels 0..1"):
        plan(table.frame, spec)
    searched = parse_spec(with_dp(node=None, search={"epsilon": 0.1}))
    assert plan(table.frame, searched).report()["lattice_nodes"] == 2 * 2 * 3 * 4 * 5
    walk = plan(table.frame, parse_spec(with_dp(node=None, search={"epsilon": 0.1, "strategy": "walk"})))
    assert walk.steps == 8 * (1 + 1 + 2 + 3 + 4)  # eight steps per level of the lattice's height
    # On a lattice of four nodes (sex and race, two levels each; the other columns explicit or sensitive)
    # eight steps per level would be 16: the default stops at the three nodes below the top.
    small = with_dp(node=None, search={"epsilon": 0.1, "strategy": "walk"})
    small["roles"]["explicit"] += ["marital-status", "education", "age"]
    small["roles"]["k_quasi"] = small["roles"]["k_quasi"][:2]
    small["roles"]["e_quasi"] = []
    assert plan(table.frame, parse_spec(small)).steps == 2 * 2 - 1
    assert walk.report()["search_quality"] == "balanced"  # the default quality model
    # A walk cannot take more steps than the lattice has nodes besides the top: refused before ε.
    too_long = with_dp(node=None, search={"epsilon": 0.1, "strategy": "walk", "steps": 2 * 2 * 3 * 4 * 5})
    with pytest.raises(SpecError, match=r"'dp.search.steps': the walk can take at most 239 steps") as refused:
        plan(table.frame, parse_spec(too_long))
    assert refused.value.parameter == "dp.search.steps"
    longest = with_dp(node=None, search={"epsilon": 0.1, "strategy": "walk", "steps": 239, "quality": "precision"})
    assert plan(table.frame, parse_spec(longest)).quality.name == "precision"
    sensitive = dp_dict(dp={**dp_dict()["dp"], "sensitive_levels": {"salary-class": 1}})
    sensitive["roles"]["sensitive"] = [{"column": "salary-class", "hierarchy": str(ADULT / "adult_hierarchy_salary-class.csv")}]
    frame = adult.copy()
    frame.loc[3, "salary-class"] = ""  # the empty cell is missing by default
    with pytest.raises(InputError, match="'salary-class': has missing values"):
        plan(classify(frame, parse_spec(sensitive)).frame, parse_spec(sensitive))


def test_an_exhaustive_search_over_too_large_a_lattice_is_refused(adult, monkeypatch):
    import kepsilon.engine.dp_release as dp_release

    monkeypatch.setattr(dp_release, "MAX_EXHAUSTIVE_NODES", 100)
    spec = parse_spec(with_dp(node=None, search={"epsilon": 0.1}))
    with pytest.raises(SpecError, match="'dp.search.strategy': the lattice has 240 nodes.*use strategy walk"):
        plan(classify(adult, spec).frame, spec)


def test_the_mechanism_generalises_every_column_and_draws_only_from_its_seed(adult):
    spec = parse_spec(dp_dict(k=20, dp={**with_dp()["dp"], "max_delta": 0.02}))
    table = classify(adult, spec).frame
    assert table["age"].dtype == "string"  # the DP mode keeps its ε-quasi as text, for its hierarchy
    dp_plan = plan(table, spec)
    first, node, report = mechanism(table, dp_plan, spec, dp_generators(bytes(range(32))))
    again, _, _ = mechanism(table, dp_plan, spec, dp_generators(bytes(range(32))))
    other, _, _ = mechanism(table, dp_plan, spec, dp_generators(bytes(range(1, 33))))
    assert first.equals(again) and not first.equals(other)
    assert node == dp_dict()["dp"]["node"]
    assert set(first["age"]) <= {"0-9", "10-19", "20-29", "30-39", "40-49", "50-59", "60-69", "70-79", "80-89", "90-99"}
    assert report["rows_published"] == len(first) == report["rows_sampled"] - report["rows_suppressed"]
    assert first.groupby(list(first.columns)).size().min() >= 20
    assert abs(report["rows_sampled"] / len(table) - spec.dp_beta()) < 0.02


def test_the_noise_advisor_refuses_a_dp_spec_by_name(tmp_path):
    from typer.testing import CliRunner

    from kepsilon.cli import app
    from kepsilon.flows.advise import AdviceRequest

    from .conftest import ROOT

    result = CliRunner().invoke(app, ["advise", str(ROOT / "releases" / "adult-dp.yaml"), "--db", str(tmp_path / "a.db")])
    assert result.exit_code == 2 and "'privacy_model': the advisor applies to privacy_model kepsilon" in result.output
    assert not (tmp_path / "a.db").exists()  # refused before the read is recorded
    with pytest.raises(SpecError, match="privacy_model"):
        AdviceRequest(spec=parse_spec(dp_dict()))


def test_the_quality_model_takes_its_losses_from_the_public_hierarchies_only(adult):
    """Under granularity a hierarchy file's labels lose their share of its leaves; a hierarchy built from
    the data (its leaves are the data's distinct values) falls back to the level's precision."""
    built = dp_dict(dp={"max_delta": 0.002, "search": {"epsilon": 0.1, "quality": "granularity"}})
    built["roles"]["e_quasi"] = [{"column": "age", "hierarchy": {"kind": "intervals", "lower": 0, "upper": 100,
                                                                 "widths": [10, 20]}}]
    spec = parse_spec(built)
    dp_plan = plan(classify(adult, spec).frame, spec)
    losses = dict(zip(dp_plan.columns, dp_plan.quality.losses))
    race = pd.read_csv(ADULT / "adult_hierarchy_race.csv", sep=";", header=None, dtype=str)
    level_one = race[1].value_counts() / len(race)  # share of the leaves under each label at level 1
    codes = dp_plan.hierarchies["race"].label_codes[1]
    assert losses["race"][1][codes] == pytest.approx(level_one[race[1]].to_numpy())
    assert [set(level.tolist()) for level in losses["age"]] == [{0.0}, {1 / 3}, {2 / 3}, {1.0}]
    records = parse_spec({**built, "dp": {**built["dp"], "search": {"epsilon": 0.1, "quality": "records"}}})
    assert all((level == 0).all() for column in plan(classify(adult, records).frame, records).quality.losses
               for level in column)
