"""The histogram of distinct k-quasi tuples: added up over partitions it equals the whole table's, and the
anonymisers give the same classes from it as from the records."""

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine.anonymise import histogram_of, k_anonymise, k_anonymise_histogram
from kepsilon.engine.histogram import merge_histograms, split_tuples, take_tuples
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.tasks.classify import classify
from kepsilon.tasks.ingest import read_source

from .conftest import release_spec_dict


def _spec(name: str, **changes) -> ReleaseSpec:
    return ReleaseSpec.model_validate(release_spec_dict(name, **changes))


def _with_criteria(spec: ReleaseSpec, criteria: dict) -> ReleaseSpec:
    data = spec.model_dump()
    last = data["roles"]["sensitive"][-1]
    data["roles"]["sensitive"][-1] = {"column": last if isinstance(last, str) else last["column"], **criteria}
    return ReleaseSpec.model_validate(data)


@pytest.fixture(scope="module")
def sample():
    spec = _spec("paper-synthetic")
    return classify(read_source(spec.source).frame, spec).frame, spec


def _cuts(n: int, parts: int, seed: int) -> list[int]:
    inner = np.sort(np.random.default_rng(seed).choice(np.arange(1, n), size=parts - 1, replace=False))
    return [0, *inner.tolist(), n]


def _partial_histograms(frame: pd.DataFrame, spec: ReleaseSpec, parts: int, seed: int):
    cuts = _cuts(len(frame), parts, seed)
    pieces = [frame.iloc[start:end] for start, end in zip(cuts[:-1], cuts[1:])]
    return [histogram_of(piece, spec, positions=piece.index.to_numpy(), extremes=True) for piece in pieces]


def _assert_same_histogram(merged, whole) -> None:
    pd.testing.assert_frame_equal(merged.tuples, whole.tuples)
    assert np.array_equal(merged.weights, whole.weights) and np.array_equal(merged.first, whole.first)
    assert set(merged.values) == set(whole.values) and set(merged.pairs) == set(whole.pairs)
    for column in whole.values:
        pd.testing.assert_series_equal(merged.values[column].sort_index(), whole.values[column].sort_index())
    for column in whole.pairs:
        pd.testing.assert_frame_equal(merged.pairs[column], whole.pairs[column])
    for column, (low, high) in whole.extremes.items():
        assert np.array_equal(merged.extremes[column][0], low) and np.array_equal(merged.extremes[column][1], high)


@pytest.mark.parametrize("parts", [2, 7])
def test_partial_histograms_add_up_to_the_whole_tables(sample, parts):
    frame, spec = sample
    spec = _with_criteria(spec, {"l_diversity": {"l": 2}})
    whole = histogram_of(frame, spec, extremes=True)
    merged = merge_histograms(_partial_histograms(frame, spec, parts, seed=parts), [q.column for q in spec.roles.k_quasi])
    _assert_same_histogram(merged, whole)
    assert merged.records == len(frame) and whole.pairs  # the criterion's pairs were counted


@pytest.mark.parametrize("targets", [1, 5, 300])
def test_split_tuples_gives_each_targets_take_tuples(sample, targets):
    """split_tuples (one gather for every bucket or leaf) equals take_tuples of each target's positions:
    tuples, counts, first positions, pairs (in their order) and extremes; targets without a tuple absent."""
    frame, spec = sample
    whole = histogram_of(frame, _with_criteria(spec, {"l_diversity": {"l": 2}}), extremes=True)
    of_tuple = np.random.default_rng(targets).integers(0, targets, len(whole)) * 2  # odd targets never occur
    parts = split_tuples(whole, of_tuple)
    assert [target for target, _, _ in parts] == sorted(set(of_tuple.tolist()))
    for target, positions, part in parts:
        assert np.array_equal(positions, np.flatnonzero(of_tuple == target))
        expected = take_tuples(whole, positions)
        _assert_same_histogram(part, expected)
        assert set(part.pairs) == set(expected.pairs) == {spec.roles.sensitive[-1] if isinstance(
            spec.roles.sensitive[-1], str) else spec.roles.sensitive[-1].column}
    assert sum(len(part) for _, _, part in parts) == len(whole)


@pytest.mark.parametrize(
    "algorithm, criteria",
    [("mondrian", None), ("mondrian", {"t_closeness": {"t": 0.3}}), ("ola", None), ("ola", {"l_diversity": {"l": 2}})],
)
def test_the_anonymisers_give_the_records_classes_from_the_added_up_histogram(sample, algorithm, criteria):
    frame, spec = sample
    spec = spec.model_copy(update={"algorithm": algorithm})
    if criteria:
        spec = _with_criteria(spec, criteria)
    partition = k_anonymise(frame, spec)
    columns = [q.column for q in spec.roles.k_quasi]
    merged = merge_histograms(_partial_histograms(frame, spec, 5, seed=11), columns)
    classes = k_anonymise_histogram(merged, spec).classes
    # Map each record to its tuple in the merged histogram, as the partitioned path does.
    index = pd.MultiIndex.from_frame(merged.tuples)
    tuple_of_record = index.get_indexer(pd.MultiIndex.from_frame(frame[columns]))
    assert (tuple_of_record >= 0).all()
    assert np.array_equal(classes.class_of_tuple[tuple_of_record], partition.class_ids)
    assert classes.report == partition.report
    assert partition.report["n_classes"] > 10


def test_tuples_are_numbered_as_pandas_groups_them_in_order_of_first_appearance():
    """The histogram's tuple numbers (histogram._tuple_numbers) are groupby(sort=False, dropna=False,
    observed=True).ngroup(), for text, missing values, categoricals and numbers."""
    from kepsilon.engine.histogram import _tuple_numbers

    rng = np.random.default_rng(3)
    rows = 5_000
    frame = pd.DataFrame({
        "zip": pd.array(np.array(["10001", "10002", None, "007"], dtype=object)[rng.integers(0, 4, rows)], dtype="str"),
        "kind": pd.Categorical(np.array(["b", "a", "c"])[rng.integers(0, 2, rows)], categories=["a", "b", "c"]),
        "year": rng.integers(1930, 1940, rows),
        "level": np.where(rng.random(rows) < 0.1, np.nan, rng.integers(0, 3, rows).astype(float)),
    })
    columns = list(frame.columns)
    expected = frame.groupby(columns, sort=False, dropna=False, observed=True).ngroup().to_numpy()
    assert np.array_equal(_tuple_numbers(frame, columns, {}), expected)
    assert np.array_equal(_tuple_numbers(frame, ["zip"], {}), frame.groupby(["zip"], sort=False, dropna=False).ngroup().to_numpy())
    assert len(_tuple_numbers(frame.iloc[:0], columns, {})) == 0
    # Codes made earlier name the values otherwise (here: any permutation, a missing value's code its own):
    # the numbers are the same.
    given = {}
    for column in ("zip", "level"):
        codes, distinct = pd.factorize(frame[column], use_na_sentinel=False)
        given[column] = rng.permutation(len(distinct) + 5)[codes]
    assert np.array_equal(_tuple_numbers(frame, columns, given), expected)


def test_tuple_numbers_stay_exact_where_the_codes_combined_pass_the_int64_range():
    """Mixed radix over columns of many distinct codes would pass 2⁶²: the running combination is renumbered
    first (histogram._COMBINED_SPAN), and the numbers are still pandas' groups."""
    from kepsilon.engine.histogram import _tuple_numbers

    rng = np.random.default_rng(5)
    rows = 20_000
    frame = pd.DataFrame({name: rng.integers(0, 50, rows) for name in "abcdefg"})
    # Each column's codes span 2³²: in int64, a column's code times 2⁶⁴ would vanish and tuples would collide.
    given = {name: np.where(frame[name].to_numpy() == 49, 2**32 - 1, frame[name].to_numpy()) for name in "abcdefg"}
    expected = frame.groupby(list("abcdefg"), sort=False).ngroup().to_numpy()
    assert np.array_equal(_tuple_numbers(frame, list("abcdefg"), given), expected)
