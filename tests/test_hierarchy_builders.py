"""Hierarchies built from a public definition: labels, nesting, identity, refusals, and use by Mondrian and OLA.

The expected labels below are written out by hand from the definitions, not computed with the code
under test.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pydantic
import pytest

from kepsilon.engine.hierarchy import Hierarchy, generalise, load_hierarchy
from kepsilon.engine.hierarchy_builders import (
    DateHierarchy,
    HierarchyBuilder,
    IntervalHierarchy,
    MaskingHierarchy,
    build_hierarchy,
    definition_sha256,
    parse_builder,
)
from kepsilon.engine.mondrian import mondrian
from kepsilon.engine.ola import _hierarchy_for, ola
from kepsilon.tasks.errors import HierarchyError

DATA = Path(__file__).resolve().parents[1] / "data"

AGES = {"kind": "intervals", "lower": 0, "upper": 90, "widths": [10, 30]}
ZIPS = {"kind": "masking", "length": 5}
DATES = {"kind": "dates", "levels": ["month", "year", "decade"]}
ADULT_AGES = {"kind": "intervals", "lower": 0, "upper": 100, "widths": [5, 10, 20, 40]}


def _labels_by_leaf(hierarchy: Hierarchy) -> dict[str, list[str]]:
    """Leaf text → its label at every level."""
    return {
        leaf: [str(level[position]) for level in hierarchy.labels] for position, leaf in enumerate(hierarchy.leaves)
    }


def _all_labels(hierarchy: Hierarchy, from_level: int = 0) -> set[str]:
    return {str(label) for level in hierarchy.labels[from_level:] for label in level}


# --------------------------------------------------------------------------------------------------
# Labels per level
# --------------------------------------------------------------------------------------------------


def test_interval_labels_at_each_level():
    hierarchy = build_hierarchy(AGES, pd.Series([0, 9, 10, 35, 59, 60, 89, 90, 35]), "age")
    labels = _labels_by_leaf(hierarchy)
    assert labels["0"] == ["0", "[0, 10)", "[0, 30)", "*"]
    assert labels["9"] == ["9", "[0, 10)", "[0, 30)", "*"]
    assert labels["10"] == ["10", "[10, 20)", "[0, 30)", "*"]
    assert labels["35"] == ["35", "[30, 40)", "[30, 60)", "*"]
    assert labels["59"] == ["59", "[50, 60)", "[30, 60)", "*"]
    assert labels["60"] == ["60", "[60, 70)", "[60, 90]", "*"]
    # The bin that ends at the upper bound is closed and holds the upper bound itself.
    assert labels["89"] == ["89", "[80, 90]", "[60, 90]", "*"]
    assert labels["90"] == ["90", "[80, 90]", "[60, 90]", "*"]
    assert hierarchy.height == 4
    assert len(hierarchy.leaves) == 8  # distinct values only


def test_interval_last_bin_is_capped_at_an_off_grid_upper_bound():
    hierarchy = build_hierarchy(
        {"kind": "intervals", "lower": 0, "upper": 95, "widths": [10, 50]}, pd.Series([3, 92, 95]), "age"
    )
    labels = _labels_by_leaf(hierarchy)
    assert labels["92"] == ["92", "[90, 95]", "[50, 95]", "*"]
    assert labels["95"] == ["95", "[90, 95]", "[50, 95]", "*"]
    assert labels["3"] == ["3", "[0, 10)", "[0, 50)", "*"]


def test_interval_bins_are_exact_for_decimal_widths():
    # In binary floating point 0.3 / 0.1 is 2.9999999999999996, which would put 0.3 in [0.2, 0.3).
    hierarchy = build_hierarchy(
        {"kind": "intervals", "lower": 0, "upper": 1, "widths": [0.1, 0.3]}, pd.Series([0.3, 0.7, 1.0, 0.05]), "share"
    )
    labels = _labels_by_leaf(hierarchy)
    assert labels["0.3"] == ["0.3", "[0.3, 0.4)", "[0.3, 0.6)", "*"]
    assert labels["0.7"] == ["0.7", "[0.7, 0.8)", "[0.6, 0.9)", "*"]
    assert labels["1.0"] == ["1.0", "[0.9, 1]", "[0.9, 1]", "*"]
    assert labels["0.05"] == ["0.05", "[0, 0.1)", "[0, 0.3)", "*"]


def test_float_columns_are_binned_exactly_at_every_edge():
    # One tenth steps put a value on a bin edge every time; the float column takes the fast path
    # and its text copy the exact one, and both must agree with the decimal reading.
    tenths = pd.Series(np.round(np.arange(0, 1001) * 0.1, 1))
    definition = {"kind": "intervals", "lower": 0, "upper": 100, "widths": [0.1, 0.5]}
    from_floats = build_hierarchy(definition, tenths, "t")
    from_text = build_hierarchy(definition, tenths.astype(str), "t")
    assert list(from_floats.leaves) == list(from_text.leaves)
    for mine, theirs in zip(from_floats.labels, from_text.labels):
        assert list(mine) == list(theirs)
    labels = _labels_by_leaf(from_floats)
    assert labels["0.3"][1:3] == ["[0.3, 0.4)", "[0, 0.5)"]
    assert labels["69.9"][1:3] == ["[69.9, 70)", "[69.5, 70)"]
    assert labels["70.0"][1:3] == ["[70, 70.1)", "[70, 70.5)"]
    assert labels["100.0"][1:3] == ["[99.9, 100]", "[99.5, 100]"]
    assert set(from_floats.labels[1]) == {f"[{v}, {w})" for v, w in zip(_tenths(0, 999), _tenths(1, 1000))} - {
        "[99.9, 100)"
    } | {"[99.9, 100]"}


def _tenths(start: int, stop: int) -> list[str]:
    """Decimal text of start/10 .. stop/10, integral ones without a fraction, written out by hand."""
    return [f"{n // 10}" if n % 10 == 0 else f"{n // 10}.{n % 10}" for n in range(start, stop + 1)]


def test_interval_bins_anchor_at_a_negative_lower_bound():
    hierarchy = build_hierarchy(
        {"kind": "intervals", "lower": -25, "upper": 25, "widths": [10]}, pd.Series([-25, -16, 0, 24.5]), "delta"
    )
    labels = _labels_by_leaf(hierarchy)
    assert labels["-25.0"][1] == "[-25, -15)"
    assert labels["-16.0"][1] == "[-25, -15)"
    assert labels["0.0"][1] == "[-5, 5)"
    assert labels["24.5"][1] == "[15, 25]"


def test_interval_leaves_are_ordered_by_number_and_carry_their_numbers():
    hierarchy = build_hierarchy(AGES, pd.Series([80, 9, 20, 9, 5]), "age")
    assert list(hierarchy.leaves) == ["5", "9", "20", "80"]  # text order would be 20, 5, 80, 9
    np.testing.assert_array_equal(hierarchy.leaf_numbers, [5.0, 9.0, 20.0, 80.0])


@pytest.mark.parametrize(
    "values",
    [
        pd.Series([30, 41, 30]),
        pd.Series([30.0, 41.5, 30.0]),
        pd.Series(["30", "41", "30"]),
        pd.Series(["30", "41", "30"], dtype=object),
        pd.Series([30, 41.5, "30"], dtype=object),
    ],
    ids=["int", "float", "str", "object-text", "object-mixed"],
)
def test_leaves_match_the_column_whatever_its_type(values):
    hierarchy = build_hierarchy(AGES, values, "age")
    codes = hierarchy.leaf_codes(values)  # raises if a value has no leaf
    assert list(generalise(values, hierarchy, 2)) == ["[30, 60)"] * 3
    assert len(set(codes)) == len(set(values.map(str)))


def test_masking_labels_at_each_level_and_lexicographic_leaves():
    hierarchy = build_hierarchy(ZIPS, pd.Series(["10001", "02139", "02138", "02139"]), "zip")
    assert list(hierarchy.leaves) == ["02138", "02139", "10001"]
    assert _labels_by_leaf(hierarchy)["02139"] == ["02139", "0213*", "021**", "02***", "0****", "*"]
    assert hierarchy.leaf_numbers is None


def test_masking_with_another_mask_character_still_tops_out_at_star():
    hierarchy = build_hierarchy({"kind": "masking", "length": 3, "mask": "#"}, pd.Series(["AB1", "AB2"]), "district")
    assert _labels_by_leaf(hierarchy)["AB1"] == ["AB1", "AB#", "A##", "*"]


def test_date_labels_at_each_level():
    hierarchy = build_hierarchy(DATES, pd.Series(["2020-03-15", "1999-12-31", "2020-03-01"]), "admitted")
    labels = _labels_by_leaf(hierarchy)
    assert labels["2020-03-15"] == ["2020-03-15", "2020-03", "2020", "2020s", "*"]
    assert labels["1999-12-31"] == ["1999-12-31", "1999-12", "1999", "1990s", "*"]


def test_date_levels_can_skip_a_truncation():
    hierarchy = build_hierarchy(
        {"kind": "dates", "levels": ["year", "decade"]}, pd.Series(["1987-06-01"]), "born"
    )
    assert _labels_by_leaf(hierarchy)["1987-06-01"] == ["1987-06-01", "1987", "1980s", "*"]


def test_date_leaves_are_chronological_in_a_non_iso_format():
    values = pd.Series(["15/03/2020", "31/12/1999", "01/04/2020"])
    hierarchy = build_hierarchy({"kind": "dates", "format": "%d/%m/%Y", "levels": ["month", "year"]}, values, "d")
    assert list(hierarchy.leaves) == ["31/12/1999", "15/03/2020", "01/04/2020"]
    assert _labels_by_leaf(hierarchy)["01/04/2020"] == ["01/04/2020", "2020-04", "2020", "*"]
    assert np.all(np.diff(hierarchy.leaf_numbers) > 0)
    # leaf_numbers are day ordinals: consecutive days differ by one.
    pair = build_hierarchy({"kind": "dates", "levels": []}, pd.Series(["2020-02-28", "2020-02-29"]), "d")
    assert pair.leaf_numbers[1] - pair.leaf_numbers[0] == 1.0


def test_file_hierarchies_have_no_leaf_numbers():
    hierarchy = load_hierarchy(DATA / "adult" / "adult_hierarchy_age.csv", "age")
    assert hierarchy.leaf_numbers is None


# --------------------------------------------------------------------------------------------------
# Nesting and identity
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "definition, values",
    [
        (
            {"kind": "intervals", "lower": 0, "upper": 100, "widths": [1, 5, 10, 50]},
            pd.Series(np.arange(0, 100.5, 0.5)),
        ),
        (
            {"kind": "intervals", "lower": 0.5, "upper": 7.25, "widths": [0.25, 0.75, 2.25]},
            pd.Series(np.arange(0.5, 7.25, 0.01)),
        ),
        (ZIPS, pd.Series([f"{n:05d}" for n in range(0, 99999, 137)])),
        (DATES, pd.Series(pd.date_range("1985-01-01", "2024-12-31", freq="17D").strftime("%Y-%m-%d"))),
    ],
    ids=["intervals", "decimal-intervals", "masking", "dates"],
)
def test_built_hierarchies_pass_olas_nesting_check(definition, values):
    hierarchy = build_hierarchy(definition, values, "c")
    assert _hierarchy_for("c", {"c": hierarchy}) is hierarchy
    # Dense codes per level, as load_hierarchy makes them.
    for level, codes in zip(hierarchy.labels, hierarchy.label_codes):
        assert codes.dtype == np.int64
        assert sorted(set(codes)) == list(range(len(set(level))))


def test_sha256_depends_on_the_definition_not_the_data():
    first = build_hierarchy(AGES, pd.Series([1, 2, 3]), "age")
    second = build_hierarchy(AGES, pd.Series([88.5, 17, 42, 42]), "age_at_entry")
    assert first.sha256 == second.sha256 == definition_sha256(IntervalHierarchy(**AGES))
    assert len(first.sha256) == 64
    other = build_hierarchy({**AGES, "widths": [10, 20]}, pd.Series([1, 2, 3]), "age")
    assert other.sha256 != first.sha256
    # Defaults count as written: leaving the mask out is the same definition as the default mask.
    assert definition_sha256(MaskingHierarchy(kind="masking", length=5)) == definition_sha256(
        parse_builder({"kind": "masking", "length": 5, "mask": "*"}, "zip")
    )
    assert definition_sha256(MaskingHierarchy(kind="masking", length=5, mask="#")) != definition_sha256(
        MaskingHierarchy(kind="masking", length=5)
    )


def test_a_model_and_its_mapping_build_the_same_hierarchy():
    values = pd.Series(["2001-01-05", "2011-07-30"])
    from_model = build_hierarchy(DateHierarchy(kind="dates", levels=["year"]), values, "d")
    from_mapping = build_hierarchy({"kind": "dates", "levels": ["year"]}, values, "d")
    assert from_model.sha256 == from_mapping.sha256
    assert [list(level) for level in from_model.labels] == [list(level) for level in from_mapping.labels]


def test_builder_union_is_tagged_on_kind():
    adapter = pydantic.TypeAdapter(HierarchyBuilder)
    assert isinstance(adapter.validate_python(AGES), IntervalHierarchy)
    assert isinstance(adapter.validate_python(ZIPS), MaskingHierarchy)
    assert isinstance(adapter.validate_python(DATES), DateHierarchy)
    schema = adapter.json_schema()
    assert schema["discriminator"]["propertyName"] == "kind"
    for model in (IntervalHierarchy, MaskingHierarchy, DateHierarchy):
        for name, field in model.model_fields.items():
            assert field.description and "<" not in field.description and ">" not in field.description, name


# --------------------------------------------------------------------------------------------------
# Refusals: named column and parameter, no data value quoted
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "definition, parameter",
    [
        ({**AGES, "lower": 90, "upper": 0}, "lower"),
        ({**AGES, "upper": float("inf")}, "upper"),
        ({**AGES, "lower": float("nan")}, "lower"),
        ({**AGES, "widths": []}, "widths"),
        ({**AGES, "widths": [10, -30]}, "widths"),
        ({**AGES, "widths": [30, 10]}, "widths"),
        ({**AGES, "widths": [10, 10]}, "widths"),
        ({**AGES, "widths": [10, 25]}, "widths"),
        ({**AGES, "upper": 1e20, "widths": [1]}, "widths"),
        ({**AGES, "bins": 3}, "bins"),
        ({"kind": "masking", "length": 0}, "length"),
        ({"kind": "masking", "length": 5, "mask": "**"}, "mask"),
        ({"kind": "dates", "levels": ["year", "month"]}, "levels"),
        ({"kind": "dates", "levels": ["year", "year"]}, "levels"),
        ({"kind": "dates", "levels": ["week"]}, "levels"),
        ({"kind": "buckets", "lower": 0}, "kind"),
    ],
)
def test_bad_definitions_are_refused_naming_column_and_parameter(definition, parameter):
    with pytest.raises(HierarchyError) as raised:
        build_hierarchy(definition, pd.Series([1, 2]), "income")
    message = str(raised.value)
    assert "'income'" in message and parameter in message
    assert raised.value.column == "income"


def test_models_refuse_bad_parameters_by_name():
    with pytest.raises(pydantic.ValidationError) as raised:
        IntervalHierarchy(kind="intervals", lower=0, upper=10, widths=[2, 3])
    assert raised.value.errors()[0]["loc"] == ("widths",)


@pytest.mark.parametrize(
    "definition, values, secret, expected",
    [
        (AGES, pd.Series([20, 91.25, 30]), "91.25", "1 value(s) are outside the public bounds [0, 90]"),
        (AGES, pd.Series([20, -3.5, -3.5, 30]), "-3.5", "2 value(s) are outside the public bounds [0, 90]"),
        (AGES, pd.Series(["20", "forty-two", "30"]), "forty-two", "1 value(s) are not finite numbers"),
        (AGES, pd.Series([20.0, float("inf"), 30.0]), "inf", "1 value(s) are not finite numbers"),
        (AGES, pd.Series(["20", "1/3"], dtype=object), "1/3", "1 value(s) are not finite numbers"),
        (ZIPS, pd.Series(["02139", "9021", "9021"]), "9021", "2 value(s) do not have length 5"),
        (ZIPS, pd.Series([2139, 10001]), "2139", "1 value(s) do not have length 5"),
        (DATES, pd.Series(["2020-03-15", "2020-02-30"]), "2020-02-30", "1 value(s) do not parse as dates"),
        (DATES, pd.Series(["2020-03-15", "15/03/2021"]), "15/03/2021", "1 value(s) do not parse as dates"),
    ],
)
def test_unplaceable_values_are_counted_never_quoted(definition, values, secret, expected):
    with pytest.raises(HierarchyError) as raised:
        build_hierarchy(definition, values, "salary")
    message = str(raised.value)
    assert message.startswith("column 'salary': ")
    assert expected in message
    assert secret not in message


def test_several_problems_are_all_counted():
    with pytest.raises(HierarchyError) as raised:
        build_hierarchy(AGES, pd.Series(["12", "abc", "140", "150", "abc"], dtype=object), "age")
    message = str(raised.value)
    assert "2 value(s) are not finite numbers" in message
    assert "2 value(s) are outside the public bounds [0, 90]" in message
    assert "abc" not in message and "140" not in message and "150" not in message


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_missing_values_are_refused(missing):
    with pytest.raises(HierarchyError, match=r"column 'age': 1 value\(s\) are missing"):
        build_hierarchy(AGES, pd.Series([20, missing, 30], dtype=object), "age")
    with pytest.raises(HierarchyError, match="missing"):
        build_hierarchy(ZIPS, pd.Series(["02139", missing]), "zip")


def test_an_empty_column_is_refused():
    with pytest.raises(HierarchyError, match="column 'age': has no values"):
        build_hierarchy(AGES, pd.Series([], dtype=float), "age")


# --------------------------------------------------------------------------------------------------
# The extreme-value attack, and use by the anonymisers
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wealth() -> pd.DataFrame:
    rng = np.random.default_rng(20261121)
    net_worth = np.round(rng.lognormal(12, 1.0, size=400)).clip(0, 4_000_000)
    net_worth[17] = 35_200_000  # the richest person, alone in their range
    return pd.DataFrame({"net_worth": net_worth.astype(np.int64)})


WEALTH = {"kind": "intervals", "lower": 0, "upper": 50_000_000, "widths": [1_000_000, 10_000_000]}


def test_interval_labels_do_not_reveal_the_maximum(wealth):
    hierarchy = build_hierarchy(WEALTH, wealth["net_worth"], "net_worth")
    generalised = _all_labels(hierarchy, from_level=1)
    assert not any("35200000" in label or "35,200,000" in label for label in generalised)
    assert _labels_by_leaf(hierarchy)["35200000"][1:] == ["[35000000, 36000000)", "[30000000, 40000000)", "*"]


def test_mondrian_without_a_hierarchy_leaks_the_maximum_and_with_one_does_not(wealth):
    leaky = mondrian(wealth, ["net_worth"], 5, {})
    assert leaky.released["net_worth"].str.contains("35200000").any()  # the attack, as today

    hierarchy = build_hierarchy(WEALTH, wealth["net_worth"], "net_worth")
    partition = mondrian(wealth, ["net_worth"], 5, {"net_worth": hierarchy})
    released = partition.released["net_worth"]
    assert not released.str.contains("35200000").any()
    assert set(released) <= _all_labels(hierarchy)
    assert partition.report["hierarchies"]["net_worth"] == hierarchy.sha256
    assert wealth.assign(label=released).groupby("label").size().min() >= 5


def test_mondrian_releases_hierarchy_labels_on_adult_ages():
    frame = pd.read_csv(DATA / "adult" / "adult.csv", sep=";").sample(n=3000, random_state=3)
    ages = build_hierarchy(ADULT_AGES, frame["age"], "age")
    race = load_hierarchy(DATA / "adult" / "adult_hierarchy_race.csv", "race")
    partition = mondrian(frame, ["age", "race"], 10, {"age": ages, "race": race})
    released = partition.released
    assert set(released["age"]) <= _all_labels(ages)
    assert released.groupby(["age", "race"]).size().min() >= 10
    # Each released age label covers the true age of its record.
    for label, age in zip(released["age"], frame["age"]):
        if label.startswith("["):
            low, high = label[1:-1].split(", ")
            assert int(low) <= age and (age <= int(high) if label.endswith("]") else age < int(high))
        elif label != "*":
            assert int(label) == age


def test_ola_releases_hierarchy_labels_at_one_level_per_column():
    frame = pd.read_csv(DATA / "adult" / "adult.csv", sep=";").sample(n=3000, random_state=5)
    ages = build_hierarchy(ADULT_AGES, frame["age"], "age")
    sex = load_hierarchy(DATA / "adult" / "adult_hierarchy_sex.csv", "sex")
    partition = ola(frame, ["age", "sex"], 10, {"age": ages, "sex": sex}, 0.02)
    level = partition.report["node"]["age"]
    assert 0 < level < ages.height
    kept = partition.kept
    expected = generalise(frame["age"], ages, level)
    assert list(partition.released["age"][kept]) == list(expected[kept])
    assert partition.released[kept].groupby(["age", "sex"]).size().min() >= 10
    assert not partition.released["age"][kept].isin([str(a) for a in frame["age"].unique()]).any()


def test_a_float_a_hair_above_the_upper_bound_is_outside():
    definition = {"kind": "intervals", "lower": 0, "upper": 0.3, "widths": [0.1]}
    inside = build_hierarchy(definition, pd.Series([0.3, 0.0]), "p")
    assert _labels_by_leaf(inside)["0.3"][1] == "[0.2, 0.3]"
    with pytest.raises(HierarchyError, match=r"1 value\(s\) are outside the public bounds \[0, 0.3\]") as raised:
        build_hierarchy(definition, pd.Series([0.3, 0.1 + 0.2]), "p")  # 0.30000000000000004
    assert "0.30000000000000004" not in str(raised.value)


def test_large_integers_keep_their_exact_order():
    big = 2**53
    values = pd.Series([big + 1, big, big + 3, big + 2], dtype=np.int64)
    hierarchy = build_hierarchy({"kind": "intervals", "lower": 0, "upper": 2**53 + 2**20, "widths": [2]}, values, "id")
    assert list(hierarchy.leaves) == [str(big), str(big + 1), str(big + 2), str(big + 3)]
    labels = _labels_by_leaf(hierarchy)
    assert labels[str(big + 1)][1] == f"[{big}, {big + 2})"
    assert labels[str(big + 2)][1] == f"[{big + 2}, {big + 4})"
