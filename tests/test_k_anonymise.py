"""Mondrian k-anonymisation: k by independent counts, released values cover the originals, the cut
rule on hand-built tables, maximality of the partition, determinism, and refused inputs."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.hierarchy import generalise, load_hierarchy
from kepsilon.engine.mondrian import mondrian
from kepsilon.engine.partition import Partition
from kepsilon.tasks.errors import HierarchyError, InputError, SpecError

from .conftest import ADULT, SYNTHETIC

PEOPLE_QUASIS = ["YOB", "GENDER", "RACE", "MARITAL_STATUS"]
ADULT_HIERARCHICAL = ["sex", "race", "marital-status"]
ADULT_QUASIS = ["age"] + ADULT_HIERARCHICAL
RANGE = re.compile(r"^\[(-?[0-9.]+)-(-?[0-9.]+)\]$")


@pytest.fixture(scope="module")
def people():
    frame = pd.read_csv(SYNTHETIC / "people.csv", sep=";", usecols=PEOPLE_QUASIS)
    hierarchies = {c: load_hierarchy(SYNTHETIC / "hierarchies" / f"{c}.csv", c) for c in PEOPLE_QUASIS}
    return frame, hierarchies


@pytest.fixture(scope="module")
def adult():
    frame = pd.read_csv(ADULT / "adult.csv", sep=";", usecols=ADULT_QUASIS)
    hierarchies = {c: load_hierarchy(ADULT / f"adult_hierarchy_{c}.csv", c) for c in ADULT_HIERARCHICAL}
    return frame, hierarchies


@pytest.fixture(scope="module")
def people_partitions(people):
    frame, hierarchies = people
    return {k: mondrian(frame, PEOPLE_QUASIS, k, hierarchies) for k in (2, 10, 100)}


@pytest.fixture(scope="module")
def adult_partition(adult):
    frame, hierarchies = adult
    return mondrian(frame, ADULT_QUASIS, 5, hierarchies)


# --- helpers: independent checks, computed from the original data with pandas -----------------------


def level_of_released(original: pd.Series, released: pd.Series, hierarchy) -> np.ndarray:
    """Lowest hierarchy level whose generalisation of each original value equals the released label
    (-1 if none: the released label is not an ancestor of the original value)."""
    level = np.full(len(original), -1)
    for candidate in reversed(range(hierarchy.height)):
        matches = generalise(original, hierarchy, candidate).to_numpy() == released.to_numpy()
        level[matches] = candidate
    return level


def parse_ranges(released: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bound of each released numeric value (`[lo-hi]` or a single value)."""
    low, high = np.empty(len(released)), np.empty(len(released))
    for i, text in enumerate(released):
        match = RANGE.match(text)
        low[i], high[i] = (float(match[1]), float(match[2])) if match else (float(text), float(text))
    return low, high


def assert_valid_partition(partition: Partition, frame: pd.DataFrame, columns: list[str], k: int) -> None:
    """k by independent group count; class ids dense and consistent with the released values."""
    released = partition.released
    assert list(released.columns) == columns
    assert released.index.equals(frame.index)
    assert released.groupby(columns).size().min() >= k
    assert partition.kept.dtype == bool and partition.kept.all()
    ids = partition.class_ids
    assert ids.dtype == np.int64 and len(ids) == len(frame)
    assert set(np.unique(ids)) == set(range(ids.max() + 1))
    assert np.bincount(ids).min() >= k
    # One released tuple per class: the class is what the released values describe.
    assert (released.groupby(ids).nunique() == 1).all().all()
    # The report is JSON and agrees with independent counts.
    report = json.loads(json.dumps(partition.report))
    sizes = np.bincount(ids)
    assert report["algorithm"] == "mondrian" and report["k"] == k
    assert report["n_classes"] == len(sizes)
    assert report["smallest_class"] == sizes.min() and report["largest_class"] == sizes.max()
    assert report["mean_class_size"] == pytest.approx(len(frame) / len(sizes))


def splittable_columns(order_keys: dict, class_ids: np.ndarray, k: int) -> list:
    """(class, column) pairs where the documented median cut would keep ≥ k records on both sides.

    Re-implements the rule from its statement: v = the ⌈m/2⌉-th smallest value; cut "≤ v" if it leaves
    ≥ k on the right, else "< v" if it leaves ≥ k on the left.
    """
    found = []
    for class_id in np.flatnonzero(np.bincount(class_ids) >= 2 * k):
        members = class_ids == class_id
        m = int(members.sum())
        for column, keys in order_keys.items():
            values = np.sort(keys[members])
            median = values[math.ceil(m / 2) - 1]
            at_most, below = (values <= median).sum(), (values < median).sum()
            if m - at_most >= k or below >= k:
                found.append((int(class_id), column))
    return found


# --- k-anonymity and coverage on the bundled data ------------------------------------------------------


@pytest.mark.parametrize("k", [2, 10, 100])
def test_every_released_group_has_k_records_on_paper_sample(people, people_partitions, k):
    frame, _ = people
    assert_valid_partition(people_partitions[k], frame, PEOPLE_QUASIS, k)


def test_larger_k_gives_fewer_larger_classes(people_partitions):
    classes = [people_partitions[k].report["n_classes"] for k in (2, 10, 100)]
    assert classes[0] > classes[1] > classes[2]


@pytest.mark.parametrize("k", [2, 10, 100])
def test_released_labels_are_lowest_common_ancestors(people, people_partitions, k):
    frame, hierarchies = people
    partition = people_partitions[k]
    for column in PEOPLE_QUASIS:
        hierarchy = hierarchies[column]
        level = level_of_released(frame[column], partition.released[column], hierarchy)
        assert (level >= 0).all(), f"{column}: a released label is not an ancestor of its value"
        # Lowest: one level down, the class's members do not all share one label.
        for below in range(hierarchy.height - 1):
            at_level = np.flatnonzero(level == below + 1)
            if len(at_level):
                lower = generalise(frame[column].iloc[at_level], hierarchy, below)
                assert (lower.groupby(partition.class_ids[at_level]).nunique() > 1).all()
        expected_precision = (level / (hierarchy.height - 1)).mean()
        assert partition.report["precision"][column] == pytest.approx(expected_precision)


def test_adult_with_numeric_age_is_k_anonymous_and_ranges_are_tight(adult, adult_partition):
    frame, hierarchies = adult
    assert_valid_partition(adult_partition, frame, ADULT_QUASIS, 5)
    low, high = parse_ranges(adult_partition.released["age"])
    age = frame["age"].to_numpy()
    assert ((low <= age) & (age <= high)).all()
    # Tight: each class's range is exactly its members' minimum and maximum.
    by_class = frame["age"].groupby(adult_partition.class_ids).agg(["min", "max"])
    assert np.array_equal(low, by_class["min"].to_numpy()[adult_partition.class_ids])
    assert np.array_equal(high, by_class["max"].to_numpy()[adult_partition.class_ids])
    assert adult_partition.report["precision"]["age"] == pytest.approx(((high - low) / np.ptp(age)).mean())
    for column in ADULT_HIERARCHICAL:
        level = level_of_released(frame[column], adult_partition.released[column], hierarchies[column])
        assert (level >= 0).all()
    assert adult_partition.report["hierarchies"] == {c: hierarchies[c].sha256 for c in ADULT_HIERARCHICAL}


# --- Mondrian actually splits: no class could be cut further ----------------------------------------------


@pytest.mark.parametrize("k", [2, 10, 100])
def test_no_class_can_be_cut_at_its_median_on_paper_sample(people, people_partitions, k):
    frame, hierarchies = people
    keys = {c: hierarchies[c].leaves.get_indexer(frame[c].astype(str)) for c in PEOPLE_QUASIS}
    assert splittable_columns(keys, people_partitions[k].class_ids, k) == []


def test_no_class_can_be_cut_at_its_median_on_adult(adult, adult_partition):
    frame, hierarchies = adult
    keys = {"age": frame["age"].to_numpy()}
    keys |= {c: hierarchies[c].leaves.get_indexer(frame[c]) for c in ADULT_HIERARCHICAL}
    assert splittable_columns(keys, adult_partition.class_ids, 5) == []


def test_many_wide_numeric_columns():
    # 6 columns of ~3,000 distinct values each: almost every row is its own tuple, and the tuples'
    # combined mixed-radix key exceeds int64 (the code re-densifies it part-way).
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(3000, 6)).round(4), columns=list("abcdef"), index=np.arange(3000) * 7)
    partition = mondrian(frame, list("abcdef"), 5, {})
    assert_valid_partition(partition, frame, list("abcdef"), 5)
    for column in "abcdef":
        low, high = parse_ranges(partition.released[column])
        assert ((low <= frame[column]) & (frame[column] <= high)).all()
    keys = {column: frame[column].to_numpy() for column in "abcdef"}
    assert splittable_columns(keys, partition.class_ids, 5) == []


# --- hand-built tables with known classes -------------------------------------------------------------------


def test_single_numeric_column_is_halved_at_the_median():
    frame = pd.DataFrame({"x": [1, 2, 3, 4, 5, 6, 7, 8]})
    partition = mondrian(frame, ["x"], 2, {})
    assert partition.released["x"].tolist() == ["[1-2]"] * 2 + ["[3-4]"] * 2 + ["[5-6]"] * 2 + ["[7-8]"] * 2
    assert partition.class_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_heavy_ties_move_the_cut_below_the_tie_run():
    # Lower median 2; "≤ 2" leaves 1 on the right, so the cut is "< 2": {1,1} | {2,2,2,2,2,3}.
    frame = pd.DataFrame({"x": [2, 1, 2, 3, 2, 1, 2, 2]})
    partition = mondrian(frame, ["x"], 2, {})
    assert partition.released["x"].tolist() == ["[2-3]", "1", "[2-3]", "[2-3]", "[2-3]", "1", "[2-3]", "[2-3]"]
    assert partition.class_ids.tolist() == [0, 1, 0, 0, 0, 1, 0, 0]


def test_a_dimension_whose_ties_leave_fewer_than_k_a_side_is_not_split():
    frame = pd.DataFrame({"x": [1, 1, 1, 1, 1, 1, 2]})
    partition = mondrian(frame, ["x"], 2, {})
    assert set(partition.released["x"]) == {"[1-2]"}
    assert partition.report["n_classes"] == 1


def test_the_widest_normalised_range_is_cut_not_the_widest_raw_range():
    # Whole table: both widths 1, tie → x (listed first), cut x ≤ 50 | x = 100. In the left half, x spans
    # 50 of 100 (0.5) and y 10 of 10 (1.0): y is cut although x's raw range is wider.
    frame = pd.DataFrame({"x": [0, 50, 0, 50, 100, 100, 100, 100], "y": [0, 0, 10, 10, 0, 10, 0, 10]})
    partition = mondrian(frame, ["x", "y"], 2, {})
    assert partition.released["x"].tolist() == ["[0-50]"] * 4 + ["100"] * 4
    assert partition.released["y"].tolist() == ["0", "0", "10", "10", "0", "10", "0", "10"]
    assert partition.class_ids.tolist() == [0, 0, 1, 1, 2, 3, 2, 3]


def test_equal_widths_go_to_the_column_listed_first():
    frame = pd.DataFrame({"x": [0, 0, 1, 1], "y": [0, 1, 0, 1]})
    assert mondrian(frame, ["x", "y"], 2, {}).class_ids.tolist() == [0, 0, 1, 1]
    assert mondrian(frame, ["y", "x"], 2, {}).class_ids.tolist() == [0, 1, 0, 1]


def test_falls_back_to_the_next_dimension_when_the_widest_cannot_be_cut():
    # Both span their whole range (1.0); x wins the tie (listed first) but its median cut would leave
    # 5 | 1 (or 0 | 6) records, fewer than k = 2 on a side, so the next dimension, y, is cut.
    frame = pd.DataFrame({"x": [0, 0, 0, 0, 0, 1], "y": [0, 0, 0, 1, 1, 2]})
    partition = mondrian(frame, ["x", "y"], 2, {})
    assert partition.released["y"].tolist() == ["0", "0", "0", "[1-2]", "[1-2]", "[1-2]"]
    assert partition.released["x"].tolist() == ["0", "0", "0", "[0-1]", "[0-1]", "[0-1]"]


def test_hierarchy_labels_and_value_sets_on_a_small_table(tmp_path):
    path = tmp_path / "letters.csv"
    path.write_text("a;ab;*\nb;ab;*\nc;cd;*\nd;cd;*\ne;ef;*\n")
    hierarchy = load_hierarchy(path, "letter")
    frame = pd.DataFrame({"letter": ["a", "b", "c", "d", "a", "b", "c", "d"], "word": list("pqrspqrs")})
    partition = mondrian(frame, ["letter"], 2, {"letter": hierarchy})
    assert partition.released["letter"].tolist() == ["a", "b", "c", "d", "a", "b", "c", "d"]
    partition = mondrian(frame, ["letter"], 3, {"letter": hierarchy})
    assert partition.released["letter"].tolist() == ["ab", "ab", "cd", "cd"] * 2
    assert partition.report["precision"]["letter"] == pytest.approx(0.5)
    partition = mondrian(frame, ["letter"], 5, {"letter": hierarchy})
    assert set(partition.released["letter"]) == {"*"}
    # A text column without hierarchy is released as the set of its values in the class.
    partition = mondrian(frame, ["word"], 3, {})
    assert partition.released["word"].tolist() == ["{p,q}", "{p,q}", "{r,s}", "{r,s}"] * 2
    assert partition.report["precision"]["word"] == pytest.approx(1 / 3)


def test_float_ranges_print_exact_values():
    frame = pd.DataFrame({"h": [150.25, 160.0, 170.5, 181.75]})
    partition = mondrian(frame, ["h"], 2, {})
    assert partition.released["h"].tolist() == ["[150.25-160]", "[150.25-160]", "[170.5-181.75]", "[170.5-181.75]"]


# --- determinism ----------------------------------------------------------------------------------------------


def test_same_input_gives_same_classes_and_ids(people, people_partitions):
    frame, hierarchies = people
    again = mondrian(frame, PEOPLE_QUASIS, 10, hierarchies)
    assert np.array_equal(again.class_ids, people_partitions[10].class_ids)
    assert again.released.equals(people_partitions[10].released)


def test_row_order_does_not_change_the_partition(adult, adult_partition):
    frame, hierarchies = adult
    shuffled = frame.sample(frac=1.0, random_state=7)
    partition = mondrian(shuffled, ADULT_QUASIS, 5, hierarchies)
    assert partition.released.loc[frame.index].equals(adult_partition.released)
    # Class ids follow the first row of each class, so they are renumbered but describe the same classes.
    same = pd.crosstab(partition.class_ids, adult_partition.class_ids[shuffled.index.to_numpy()])
    assert ((same > 0).sum(axis=1) == 1).all() and ((same > 0).sum(axis=0) == 1).all()


# --- refused inputs: errors name the parameter or column, never a value ----------------------------------------


@pytest.mark.parametrize("k", [1, 0, -3, 2.5, "10", True, None])
def test_bad_k_is_refused(k):
    with pytest.raises(SpecError) as error:
        mondrian(pd.DataFrame({"x": [1, 2, 3]}), ["x"], k, {})
    assert error.value.parameter == "k"


def test_k_larger_than_the_table_is_refused_with_the_row_count():
    with pytest.raises(SpecError) as error:
        mondrian(pd.DataFrame({"x": [1, 2, 3]}), ["x"], 4, {})
    assert error.value.parameter == "k" and "3" in str(error.value)


def test_unknown_column_is_named():
    with pytest.raises(InputError) as error:
        mondrian(pd.DataFrame({"x": [1, 2, 3]}), ["x", "ZIP"], 2, {})
    assert error.value.column == "ZIP"


@pytest.mark.parametrize("columns", [[], ["x", "x"], "x"])
def test_bad_column_lists_are_refused(columns):
    with pytest.raises(SpecError) as error:
        mondrian(pd.DataFrame({"x": [1, 2, 3]}), columns, 2, {})
    assert error.value.parameter == "columns"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_numbers_are_refused(bad):
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "weight": [61.5, bad, 72.25]})
    with pytest.raises(InputError) as error:
        mondrian(frame, ["x", "weight"], 2, {})
    assert error.value.column == "weight"
    assert "61.5" not in str(error.value) and "72.25" not in str(error.value)


def test_missing_text_value_is_refused():
    frame = pd.DataFrame({"town": ["Cork", None, "Galway"]})
    with pytest.raises(InputError) as error:
        mondrian(frame, ["town"], 2, {})
    assert error.value.column == "town" and "Cork" not in str(error.value)


def test_value_missing_from_hierarchy_is_refused_without_quoting_it(people):
    frame, hierarchies = people
    frame = frame.copy()
    frame.loc[5, "RACE"] = "Xyzzy-Secret"
    with pytest.raises(HierarchyError) as error:
        mondrian(frame, PEOPLE_QUASIS, 10, hierarchies)
    assert error.value.column == "RACE" and "Xyzzy-Secret" not in str(error.value)


def test_empty_frame_is_refused():
    with pytest.raises(InputError) as error:
        mondrian(pd.DataFrame({"x": pd.Series([], dtype=int)}), ["x"], 2, {})
    assert error.value.column is None
