"""The partition stages' faster helpers give exactly what the code they replaced gave (issue 25).

Each helper is compared with the plain formulation it stands for, on inputs that reach its edge cases:
missing values, absent classes, ties, a single target, and the fall-back paths.
"""

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.hierarchy import ClassRuns, Hierarchy, lowest_common_levels
from kepsilon.engine.suppress import ClassSortedValues
from kepsilon.tasks.counting import by_target, first_occurrences, slices_by_target, value_pair_counts

RNG = np.random.default_rng(25)


def _hierarchy(leaves: int, fan: list[int]) -> Hierarchy:
    """A hierarchy of ``leaves`` leaves whose level l groups ``fan[l - 1]`` consecutive labels of level l - 1."""
    codes = [np.arange(leaves, dtype=np.int64)]
    for width in fan:
        codes.append(codes[-1] // width)
    codes.append(np.zeros(leaves, dtype=np.int64))
    labels = tuple(np.array([f"{level}:{code}" for code in level_codes], dtype=object) for level, level_codes in enumerate(codes))
    label_codes = tuple(pd.factorize(level_labels)[0].astype(np.int64) for level_labels in labels)
    return Hierarchy("column", pd.Index(labels[0]), labels, label_codes, "sha")


def _scattered_levels(leaf_codes: np.ndarray, class_ids: np.ndarray, hierarchy: Hierarchy) -> np.ndarray:
    """The lowest common level as it was computed before (a scatter per level with ``np.minimum.at``)."""
    n_classes = int(class_ids.max()) + 1
    result = np.full(n_classes, hierarchy.height - 1, dtype=np.int64)
    settled = np.zeros(n_classes, dtype=bool)
    for level in range(hierarchy.height):
        codes = hierarchy.label_codes[level][leaf_codes]
        low = np.full(n_classes, np.iinfo(np.int64).max)
        high = np.full(n_classes, np.iinfo(np.int64).min)
        np.minimum.at(low, class_ids, codes)
        np.maximum.at(high, class_ids, codes)
        uniform = (low == high) & ~settled
        result[uniform] = level
        settled |= uniform
    return result


@pytest.mark.parametrize("classes", [1, 7, 400])
def test_lowest_common_levels_by_runs_are_the_scattered_ones(classes):
    hierarchy = _hierarchy(60, [3, 4])
    class_ids = RNG.integers(0, classes, 5_000)
    class_ids[class_ids == classes // 2] = 0  # a class without members keeps the top level
    leaf_codes = (class_ids * 7 + RNG.integers(0, 3, len(class_ids))) % 60  # some classes agree low, some high
    expected = _scattered_levels(leaf_codes, class_ids, hierarchy)
    assert np.array_equal(lowest_common_levels(leaf_codes, class_ids, hierarchy), expected)
    assert np.array_equal(lowest_common_levels(leaf_codes, class_ids, hierarchy, ClassRuns.of(class_ids)), expected)


@pytest.mark.parametrize(("classes", "values", "counted"), [
    (50, "levels", True),  # few classes and value levels: the keys are counted
    (15_000, "levels", True),  # a class partition's shape: about 13 records a class, 40 levels
    (5_000, "hundredths", False),  # values in hundredths: sorted, searched in (class, bucket) cells
    (70_000, "hundredths", False),  # too many classes to group the rows by a radix sort first
    (5_000, "outlier", False),  # one far value: nearly every value in one bucket, long searches in the cells
    (70_000, "equal", True),  # one value, queries on it and around it
    (5_000, "extremes", False),  # a range wider than the largest float: one bucket
])
def test_class_sorted_positions_are_the_searches_in_sorted_keys(classes, values, counted):
    dense = RNG.integers(0, classes, 200_000)
    column = {
        "levels": lambda: RNG.integers(0, 40, len(dense)).astype(np.float64),  # many ties
        "hundredths": lambda: np.round(RNG.normal(170, 10, len(dense)), 2),
        "outlier": lambda: np.append(np.round(RNG.normal(170, 10, len(dense) - 1), 2), 1e9),
        "equal": lambda: np.full(len(dense), 5_000.0),
        "extremes": lambda: np.concatenate([np.round(RNG.normal(170, 10, len(dense) - 2), 2), [-1.5e308, 1.5e308]]),
    }[values]()
    index = ClassSortedValues(dense, column)
    assert index.counted == counted
    distinct, ranks = np.unique(column, return_inverse=True)
    keys = np.sort(dense * (len(distinct) + 1) + ranks)
    assert np.array_equal(index.sorted_keys(), keys)
    order = np.lexsort((column, dense))
    sorted_values, sorted_classes = index.sorted_values()
    assert np.array_equal(sorted_values, column[order]) and np.array_equal(sorted_classes, dense[order])
    others = np.concatenate([dense, [classes, classes + 7]])  # rows of classes the index does not hold
    for rows in (dense, dense.copy(), others):
        bounds = column[RNG.integers(0, len(column), len(rows))] + np.round(RNG.normal(0, 5, len(rows)), 2)
        bounds[::50] = column[RNG.integers(0, len(column), len(bounds[::50]))]  # bounds equal to values
        bounds[1::997] = np.inf
        bounds[2::997] = -np.inf
        for inclusive in (False, True):
            query_ranks = np.searchsorted(distinct, bounds, side="right" if inclusive else "left")
            expected = np.searchsorted(keys, rows * (len(distinct) + 1) + query_ranks, side="left")
            assert np.array_equal(index.position(rows, bounds, inclusive), expected)


def _value_counts(values: pd.Series, labels: pd.Series) -> pd.DataFrame:
    return (pd.DataFrame({"value": values.to_numpy(), "label": labels.to_numpy()})
            .value_counts(sort=False, dropna=False).rename("records").reset_index())


@pytest.mark.parametrize("kind", ["str", "object", "category", "int", "float"])
def test_value_pair_counts_are_value_counts(kind):
    rows = 3_000
    texts = np.array(["b", "a", None, "007", "c"], dtype=object)[RNG.integers(0, 5, rows)]
    values = {
        "str": pd.Series(texts, dtype=str),
        "object": pd.Series(texts, dtype=object),
        "category": pd.Series(texts, dtype="category"),
        "int": pd.Series(RNG.integers(0, 9, rows)),
        "float": pd.Series(np.where(RNG.random(rows) < 0.1, np.nan, RNG.integers(0, 9, rows).astype(float))),
    }[kind]
    labels = pd.Series(np.array(["x", "*", "y"], dtype=object)[RNG.integers(0, 3, rows)], dtype=str)
    pd.testing.assert_frame_equal(value_pair_counts(values, labels), _value_counts(values, labels), check_exact=True)
    # With the codes stage D has (categorical codes shifted past -1, a missing value's), the same counts.
    codes = (pd.Categorical(values).codes.astype(np.int64) + 1, pd.Categorical(labels).codes.astype(np.int64) + 1)
    pd.testing.assert_frame_equal(value_pair_counts(values, labels, codes), _value_counts(values, labels), check_exact=True)
    empty = pd.Series([], dtype=str)
    pd.testing.assert_frame_equal(value_pair_counts(empty, empty), _value_counts(empty, empty), check_exact=True)


def test_first_occurrences_number_codes_as_first_met():
    codes = np.array([5, 3, 5, 9, 3, 1], dtype=np.int64)
    numbers, firsts = first_occurrences(codes)
    assert numbers.tolist() == [0, 1, 0, 2, 1, 3]
    assert firsts.tolist() == [0, 1, 3, 5]


@pytest.mark.parametrize("targets", [np.array([2, 0, 2, 1, 0, 2]), np.zeros(4, dtype=np.int64), np.zeros(0, dtype=np.int64)])
def test_rows_by_target_are_the_masks(targets):
    order, runs = by_target(targets)
    assert [target for target, _ in runs] == np.unique(targets).tolist()
    for target, rows in runs:
        assert order[rows].tolist() == np.flatnonzero(targets == target).tolist()
    order, slices = slices_by_target(targets, 4)  # target 3 never occurs: an empty slice
    assert [order[rows].tolist() for rows in slices] == [np.flatnonzero(targets == t).tolist() for t in range(4)]


@pytest.mark.parametrize("hashes", ["their own", "all equal"])
def test_each_piece_reads_back_its_own_tuples_classes_from_the_merged_shards(tmp_path, hashes):
    """A piece's tuples get the classes the shards' tuples got, through where the merge placed each partial's
    tuples (``PARTIAL_PLACES``), never matched by hash: tuples that share a hash (all of them, forced) keep their own
    classes; a tuple in no class (-1) stays out, and a piece with no tuple in a bucket reads nothing from it."""
    from kepsilon.engine.histogram import tuple_histogram
    from kepsilon.tasks.partitioned import piece_classes
    from kepsilon.tasks.scratch import Scratch
    from kepsilon.tasks.shards import PIECE_CLASSES, merge_shard, tuple_hashes, write_partials, write_piece_classes

    scratch = Scratch.new(tmp_path / "scratch")
    columns = ["ZIP", "SEX"]
    text = pd.array(["00501", "10001", None, "10001", "20002", "00501", None], dtype=str)
    sex = pd.array(["F", "F", "M", "M", "F", "F", "M"], dtype=str)
    pieces = [pd.DataFrame({"ZIP": text[:4], "SEX": sex[:4]}), pd.DataFrame({"ZIP": text[3:], "SEX": sex[3:]})]
    buckets = 3
    histograms, bucket_of_tuple = [], []
    for number, frame in enumerate(pieces):
        histogram = tuple_histogram(frame, columns)
        own = tuple_hashes(histogram.tuples, columns)
        forced = own if hashes == "their own" else np.full(len(own), own[0])  # every tuple in one bucket
        histograms.append(histogram)
        bucket_of_tuple.append(write_partials(scratch, histogram, columns, buckets, number, forced))
    offsets = [0, len(pieces[0])]
    expected_class = {("00501", "F"): 4, ("10001", "F"): 0, (None, "M"): -1, ("10001", "M"): 2, ("20002", "F"): 1}

    def key(row) -> tuple:
        return tuple(None if pd.isna(value) else value for value in row)

    for bucket in range(buckets):
        merge_shard(scratch, bucket, offsets, columns)
        shard = scratch.read("shard", bucket)
        classes = np.array([expected_class[key(row)] for row in shard.tuples[columns].itertuples(index=False)],
                           dtype=np.int64)
        write_piece_classes(scratch, bucket, classes)
    for number, histogram in enumerate(histograms):
        got = piece_classes(scratch, number, bucket_of_tuple[number])
        assert got.tolist() == [expected_class[key(row)] for row in histogram.tuples[columns].itertuples(index=False)]
        absent = set(range(buckets)) - set(bucket_of_tuple[number].tolist())
        assert all(not scratch.exists(PIECE_CLASSES, number, bucket) for bucket in absent)
    scratch.write(np.zeros(0, dtype=np.int64), PIECE_CLASSES, 0, int(bucket_of_tuple[0][0]))  # a bucket's file cut short
    with pytest.raises(RuntimeError, match="differ in number"):
        piece_classes(scratch, 0, bucket_of_tuple[0])


@pytest.mark.parametrize("columns", [["A"], ["A", "B"], ["B", "C", "A"]])
def test_combination_codes_number_the_groups_as_groupby(columns):
    from kepsilon.tasks.counting import column_codes, combination_codes

    rows = 2_000
    frame = pd.DataFrame({
        "A": pd.Series(np.array(["x", "y", None, "z"], dtype=object)[RNG.integers(0, 4, rows)], dtype=str),
        "B": pd.Series(np.array(["1", "2", "3"], dtype=object)[RNG.integers(0, 3, rows)], dtype="category"),
        "C": pd.Series(np.where(RNG.random(rows) < 0.1, np.nan, RNG.integers(0, 5, rows).astype(float))),
    })
    numbers, _ = first_occurrences(combination_codes(column_codes(frame, ["C", "A", "B"]), columns, rows))
    expected = frame.groupby(columns, sort=False, dropna=False, observed=True).ngroup().to_numpy()
    assert np.array_equal(numbers, expected)


@pytest.mark.parametrize("spread", [1, 3, 50])
def test_keyed_words_block_by_block_are_the_generators(spread):
    from kepsilon.engine import randomness

    key = int.from_bytes(RNG.bytes(16), "little")
    positions = RNG.choice(2_000 * spread, 2_000, replace=False)  # close together (runs) or spread thin (block by block)
    expected = np.random.Philox(key=key, counter=0).random_raw(4 * 2_000 * spread).reshape(-1, 4)[positions, 0]
    assert np.array_equal(randomness._keyed_words(key, positions), expected)
    assert np.array_equal(randomness._philox_first_words(key, positions), expected)
    far = np.array([2**40, 2**62], dtype=np.int64)  # a block's word depends on its counter alone, however large
    assert randomness._philox_first_words(key, far).tolist() == [
        int(np.random.Philox(key=key, counter=int(p)).random_raw(4)[0]) for p in far]



def test_a_group_key_is_the_same_from_categorical_labels_as_from_their_text():
    """Stage C hands GroupCoder.keys its labels as categoricals (their distinct labels listed once, unused ones
    too): the keys are those of the same labels as text."""
    from kepsilon.tasks.partitioned import GroupCoder

    vocabularies = (pd.Index(["*", "0****", "00***", "10***"], dtype=object), pd.Index(["F", "M", "*"], dtype=object))
    coder = GroupCoder(("ZIP", "SEX"), vocabularies, (4, 3), (), (), ())
    zip_labels = np.array(["00***", "10***", "*", "00***", "0****"], dtype=object)
    sex_labels = np.array(["M", "*", "F", "M", "F"], dtype=object)
    text = pd.DataFrame({"ZIP": pd.array(zip_labels, dtype=str), "SEX": pd.array(sex_labels, dtype=str)})
    categorical = pd.DataFrame({
        "ZIP": pd.Categorical(zip_labels, categories=["10***", "*", "00***", "0****", "unused"]),
        "SEX": pd.Categorical(sex_labels, categories=["*", "M", "F"]),
    })
    expected = [2 * 3 + 1, 3 * 3 + 2, 0 * 3 + 0, 2 * 3 + 1, 1 * 3 + 0]
    assert coder.keys(text).tolist() == expected
    assert coder.keys(categorical).tolist() == expected
