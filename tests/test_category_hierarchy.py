"""The categories builder: a categorical k-quasi (sex, blood group) generalised without a hierarchy file.

Expected labels are written out by hand from the definitions, not computed with the code under test.
"""

import numpy as np
import pandas as pd
import pytest
import yaml

from kepsilon.engine.hierarchy import generalise
from kepsilon.engine.hierarchy_builders import CategoryHierarchy, build_hierarchy, definition_sha256
from kepsilon.engine.mondrian import mondrian
from kepsilon.engine.ola import _hierarchy_for, ola
from kepsilon.flows.spec import parse_spec
from kepsilon.tasks.errors import HierarchyError, SpecError

SEX = {"kind": "categories"}
BLOOD = {"kind": "categories", "groups": {"A": ["A+", "A-"], "B": ["B+", "B-"], "O": ["O+", "O-"], "AB": ["AB+", "AB-"]}}


def _labels_by_leaf(hierarchy) -> dict[str, list[str]]:
    return {leaf: [str(level[at]) for level in hierarchy.labels] for at, leaf in enumerate(hierarchy.leaves)}


def test_without_groups_each_value_then_star():
    hierarchy = build_hierarchy(SEX, pd.Series(["M", "F", "F", "X", "M"]), "sex")
    assert _labels_by_leaf(hierarchy) == {"F": ["F", "*"], "M": ["M", "*"], "X": ["X", "*"]}
    assert hierarchy.height == 2
    assert list(hierarchy.leaves) == ["F", "M", "X"]  # text order
    assert hierarchy.leaf_numbers is None


def test_with_groups_value_group_star_in_declared_order():
    values = pd.Series(["O+", "A-", "AB+", "B+", "O-", "A+", "O+"])
    hierarchy = build_hierarchy(BLOOD, values, "blood")
    labels = _labels_by_leaf(hierarchy)
    assert labels["A-"] == ["A-", "A", "*"]
    assert labels["AB+"] == ["AB+", "AB", "*"]
    assert labels["O-"] == ["O-", "O", "*"]
    assert hierarchy.height == 3
    # Leaves present in the data only, group by group in the order of the definition: siblings adjacent.
    assert list(hierarchy.leaves) == ["A+", "A-", "B+", "O+", "O-", "AB+"]
    assert _hierarchy_for("blood", {"blood": hierarchy}) is hierarchy  # OLA's nesting check passes
    for level, codes in zip(hierarchy.labels, hierarchy.label_codes):
        assert sorted(set(codes)) == list(range(len(set(level))))


def test_values_are_matched_as_text():
    definition = {"kind": "categories", "groups": {"low": ["007", "010"], "high": ["700"]}}
    hierarchy = build_hierarchy(definition, pd.Series(["007", "700", "010"]), "code")
    assert _labels_by_leaf(hierarchy)["007"] == ["007", "low", "*"]
    # The number 7 is not the text 007: refused as ungrouped rather than matched by accident.
    with pytest.raises(HierarchyError, match="1 value"):
        build_hierarchy(definition, pd.Series(["7", "700"]), "code")


def test_a_value_in_no_group_is_refused_by_column_and_count_never_quoted():
    values = pd.Series(["A+", "A+", "Zq-secret", "Zq-secret", "Zq-secret", "B-"])
    with pytest.raises(HierarchyError) as raised:
        build_hierarchy(BLOOD, values, "blood")
    message = str(raised.value)
    assert raised.value.column == "blood"
    assert "3 value(s) are in no declared group" in message
    assert "Zq-secret" not in message


@pytest.mark.parametrize(
    "groups, reason",
    [
        ({"yes-no": [True, False]}, "list of texts"),  # YAML's unquoted yes / no
        ({1: ["1"]}, "group label must be text"),
        ({"*": ["M", "F"]}, "not '*'"),
        ({"": ["M"]}, "non-empty"),
        ({"a": ["M"], "b": ["M", "F"]}, "listed in two groups"),
        ({}, "at least one group"),
        ({"a": []}, "lists no value"),
        ({"M": ["M", "F"]}, "also a value"),
        ("M, F", "dictionary"),
    ],
)
def test_bad_groupings_are_refused_naming_the_column(groups, reason):
    with pytest.raises(HierarchyError) as raised:
        build_hierarchy({"kind": "categories", "groups": groups}, pd.Series(["M", "F"]), "sex")
    assert raised.value.column == "sex"
    assert "groups" in str(raised.value) and reason in str(raised.value)


def test_a_singleton_group_may_carry_its_value_as_label():
    hierarchy = build_hierarchy({"kind": "categories", "groups": {"F": ["F"], "other": ["M", "X"]}}, pd.Series(["F", "M"]), "sex")
    assert _labels_by_leaf(hierarchy) == {"F": ["F", "F", "*"], "M": ["M", "other", "*"]}


def test_identity_is_the_definition():
    first = build_hierarchy(BLOOD, pd.Series(["A+"]), "blood")
    second = build_hierarchy(BLOOD, pd.Series(["O-", "B+"]), "blood_group")
    assert first.sha256 == second.sha256 == definition_sha256(CategoryHierarchy(**BLOOD))
    assert build_hierarchy(SEX, pd.Series(["A+"]), "blood").sha256 != first.sha256


def _spec(hierarchy) -> dict:
    return {
        "release_id": "r",
        "population_id": "p",
        "source": {"path": "people.csv"},
        "roles": {"k_quasi": [{"column": "sex", "hierarchy": hierarchy}], "sensitive": ["x"]},
        "k": 5,
        "epsilon": 1.0,
    }


def test_the_spec_takes_the_builder_from_yaml():
    raw = yaml.safe_load(
        "hierarchy: {kind: categories, groups: {known: [M, F], other: [X, 'no']}}"
    )["hierarchy"]
    spec = parse_spec(_spec(raw))
    assert spec.roles.k_quasi[0].hierarchy == CategoryHierarchy(kind="categories", groups={"known": ["M", "F"], "other": ["X", "no"]})
    # Unquoted no is a boolean in YAML: refused by name, with the fix.
    unquoted = yaml.safe_load("hierarchy: {kind: categories, groups: {other: [X, no]}}")["hierarchy"]
    with pytest.raises(SpecError, match="roles.k_quasi.0.hierarchy.categories.groups.*quote"):
        parse_spec(_spec(unquoted))


def test_mondrian_releases_only_the_hierarchys_labels_with_groups_of_k():
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({"blood": rng.choice(["A+", "A-", "B+", "B-", "O+", "O-", "AB+", "AB-"], size=400,
                                              p=[0.34, 0.06, 0.09, 0.02, 0.38, 0.07, 0.03, 0.01])})
    hierarchy = build_hierarchy(BLOOD, frame["blood"], "blood")
    partition = mondrian(frame, ["blood"], 20, {"blood": hierarchy})
    released = partition.released["blood"]
    assert set(released) <= {"A+", "A-", "B+", "B-", "O+", "O-", "AB+", "AB-", "A", "B", "O", "AB", "*"}
    assert frame.assign(label=released).groupby("label").size().min() >= 20
    # Each released label covers its record's value (a value, its own group, or *).
    group = {v: g for g, vs in BLOOD["groups"].items() for v in vs}
    assert all(label in (value, group[value], "*") for label, value in zip(released, frame["blood"]))


def test_ola_generalises_categories_at_one_level():
    rng = np.random.default_rng(8)
    frame = pd.DataFrame({"sex": rng.choice(["F", "M", "X"], size=300, p=[0.5, 0.49, 0.01])})
    hierarchy = build_hierarchy(SEX, frame["sex"], "sex")
    partition = ola(frame, ["sex"], 10, {"sex": hierarchy}, 0.02)
    # X (about 3 records) cannot stand alone at k = 10; within a 2 % budget OLA suppresses it at level 0.
    assert partition.report["node"]["sex"] == 0
    kept = partition.kept
    assert list(partition.released["sex"][kept]) == list(generalise(frame["sex"], hierarchy, 0)[kept])
    assert set(partition.released["sex"][kept]) == {"F", "M"}


@pytest.mark.parametrize(
    "hierarchy, sensitive, location",
    [
        ({"kind": "intervals", "lower": 0, "upper": 10, "widths": [2, 3]}, ["x"], "roles.k_quasi.0.hierarchy.intervals.widths"),
        ({"kind": "categories", "groups": {"a": []}}, ["x"], "roles.k_quasi.0.hierarchy.categories.groups"),
        (SEX, [{"column": "x", "t_closeness": {"t": 3}}], "roles.sensitive.0.t_closeness.t"),
        (SEX, [{"column": "x", "l_diversity": {"l": 1}}], "roles.sensitive.0.l_diversity.l"),
    ],
)
def test_a_bad_builder_or_entry_is_named_by_its_own_parameter(hierarchy, sensitive, location):
    """Not "hierarchy.str: Input should be a valid string", pydantic's first error for the union."""
    raw = _spec(hierarchy)
    raw["roles"]["sensitive"] = sensitive
    with pytest.raises(SpecError) as raised:
        parse_spec(raw)
    assert str(raised.value).startswith(f"parameter '{location}': ")
