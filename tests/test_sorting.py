"""kepsilon/engine/sorting.py gives NumPy's answers: the same order (equal keys in position order) and
the same numbering of distinct values, on the shapes the per-class steps sort."""
import numpy as np
import pytest

from kepsilon.engine.sorting import key_then_position_order, mostly_ascending, stable_argsort, unique_inverse


def _grouped(runs: int, records: int = 40_000, width: int = 1_000) -> np.ndarray:
    """Keys ``class·width + rank`` of records in ``runs`` runs, each sorted by class (about 20 records a
    class), the ranks within a class in random order with ties: a class partition's ClassSortedValues keys."""
    rng = np.random.default_rng(runs)
    classes = rng.integers(0, records // 20, records)
    run = rng.integers(0, runs, records)
    order = np.lexsort((classes, run))
    return classes[order] * width + rng.integers(0, 30, records)


@pytest.mark.parametrize("keys", [
    np.random.default_rng(1).integers(0, 50, 10_000),  # many ties: stability shows
    np.random.default_rng(2).integers(-10**6, 10**6, 5_000),  # negative keys
    np.random.default_rng(3).integers(0, 2**40, 3_000, dtype=np.int64),  # key span + positions fit 63 bits
    np.random.default_rng(4).integers(0, 2**62, 3_000, dtype=np.int64),  # they do not: NumPy's sort
    np.random.default_rng(5).integers(0, 2**64 - 1, 2_000, dtype=np.uint64),  # uint64 above 2⁶³
    np.random.default_rng(6).integers(2**63, 2**63 + 1000, 2_000, dtype=np.uint64),  # high uint64, small span
    np.random.default_rng(7).integers(0, 200, 4_000).astype(np.int16),
    np.array([5]), np.array([], dtype=np.int64), np.array([3, 3, 3, 1, 1]),
    _grouped(1), _grouped(6), _grouped(60),  # class-sorted runs, random within a class: the stable sort's path
    np.arange(10_000)[::-1],  # descending
])
def test_stable_argsort_is_numpys_stable_argsort(keys):
    assert np.array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))


def test_mostly_ascending_tells_class_sorted_runs_from_random_order():
    assert mostly_ascending(_grouped(1)) and mostly_ascending(_grouped(60))
    assert not mostly_ascending(np.random.default_rng(11).integers(0, 10**6, 50_000))
    assert not mostly_ascending(np.arange(50_000)[::-1])
    assert not mostly_ascending(np.array([1, 2, 3]))  # too short to tell: the quicksort


@pytest.mark.parametrize("values", [
    np.round(np.random.default_rng(8).normal(170, 10, 20_000), 1),
    np.array([0.0, -0.0, np.nan, 1.5, np.nan, -0.0, 2.0, -np.inf, np.inf]),
    np.random.default_rng(9).integers(0, 10**9, 10_000) * 7,
    np.array([], dtype=np.float64),
])
def test_unique_inverse_is_numpys_unique(values):
    distinct, inverse = unique_inverse(values)
    expected_distinct, expected_inverse = np.unique(values, return_inverse=True)
    assert np.array_equal(distinct, expected_distinct, equal_nan=True)
    assert np.array_equal(inverse, expected_inverse.reshape(-1))
    assert inverse.dtype == np.int64


@pytest.mark.parametrize("keys", [
    np.random.default_rng(12).integers(0, 2**64 - 1, 20_000, dtype=np.uint64),  # distinct: one sort by key
    np.random.default_rng(13).integers(0, 30, 20_000).astype(np.uint64),  # ties: the positions decide
    np.array([7, 7], dtype=np.uint64), np.array([], dtype=np.uint64),
])
def test_key_then_position_order_is_the_lexsort(keys):
    positions = np.random.default_rng(14).permutation(len(keys) * 3)[:len(keys)]
    assert np.array_equal(key_then_position_order(keys, positions), np.lexsort((positions, keys)))
