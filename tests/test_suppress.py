"""Confidence-based suppression: vectorised ℓ_i against a naive reference, hand-built rules, parameters."""

import math

import numpy as np
import pytest

from kepsilon.engine.suppress import (
    ClassSortedValues,
    confidence_radius,
    confidence_suppress,
    confidence_suppress_columns,
    matches_within_radius,
)
from kepsilon.tasks.errors import SpecError

# c with −ln(1 − c) = 1.5, so a scale of 1 gives an interval of half-width 1.5.
C_RADIUS_1_5 = 1 - math.exp(-1.5)


def naive_matches(original, noisy, class_ids, radius):
    """O(m²) per class reference: count class originals inside each record's interval."""
    matches = np.zeros(len(original), dtype=np.int64)
    for cls in np.unique(class_ids):
        rows = np.flatnonzero(class_ids == cls)
        low = (noisy[rows] - radius[rows])[:, None]
        high = (noisy[rows] + radius[rows])[:, None]
        inside = (original[rows][None, :] >= low) & (original[rows][None, :] <= high)
        matches[rows] = inside.sum(axis=1)
    return matches


def naive_suppression(original, noisy, class_ids, scales, k, confidence):
    radius = -scales * math.log(1 - confidence)
    matches = naive_matches(original, noisy, class_ids, radius)
    record_rule = (matches > 0) & (matches < k)
    class_rule = np.zeros(len(original), dtype=bool)
    for cls in np.unique(class_ids):
        rows = class_ids == cls
        if rows.sum() - (matches[rows] < k).sum() < k:
            class_rule |= rows
    return record_rule, class_rule & ~record_rule


def random_release(seed, n_classes=300, decimals=1):
    """Classes of 1-39 records; values in tenths (sorted by ClassSortedValues) or, with ``decimals=0``, in
    whole units (few enough levels for its counted keys)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, size=n_classes)
    class_ids = np.repeat(rng.choice(10**6, size=n_classes, replace=False), sizes)
    rng.shuffle(class_ids)
    # Rounded values make ties between originals and interval ends common.
    original = np.round(rng.normal(170, 10, size=len(class_ids)), decimals)
    scales = np.round(rng.exponential(3, size=n_classes), 1)[np.unique(class_ids, return_inverse=True)[1]]
    noisy = np.round(original + rng.laplace(0, 1, len(original)) * scales, decimals)
    return original, noisy, class_ids, scales


@pytest.mark.parametrize("decimals", [1, 0])
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_matches_equal_naive_reference(seed, decimals):
    original, noisy, class_ids, scales = random_release(seed, decimals=decimals)
    radius = confidence_radius(scales, 0.9)
    dense = np.unique(class_ids, return_inverse=True)[1]
    assert ClassSortedValues(dense, original).counted == (decimals == 0)
    fast = matches_within_radius(original, noisy, dense, radius)
    assert np.array_equal(fast, naive_matches(original, noisy, class_ids, radius))
    assert fast.max() > 5 and (fast == 0).any()  # the case exercises both ends


@pytest.mark.parametrize("decimals", [1, 0])
@pytest.mark.parametrize("seed", range(5))
def test_rules_equal_naive_reference(seed, decimals):
    original, noisy, class_ids, scales = random_release(100 + seed, decimals=decimals)
    result = confidence_suppress(original, noisy, class_ids, scales, k=5, confidence=0.8)
    record_rule, class_rule = naive_suppression(original, noisy, class_ids, scales, 5, 0.8)
    assert np.array_equal(result.record_rule, record_rule)
    assert np.array_equal(result.class_rule, class_rule)
    assert np.array_equal(result.removed, record_rule | class_rule)
    assert result.record_rule.any() and result.class_rule.any()


def test_radius_formula():
    assert confidence_radius(np.array([2.0]), 0.99)[0] == pytest.approx(-2.0 * math.log(0.01))
    assert confidence_radius(np.array([1.0]), C_RADIUS_1_5)[0] == pytest.approx(1.5)


def hand_built():
    """Four classes (k = 3, half-width 1.5 where the scale is 1), rows interleaved, ids not dense.

    A (id 40): originals 0,1,2,3,10; noisy 1.1 → {0,1,2} ℓ=3, 2.0 → {1,2,3} ℓ=3, 2.9 → {2,3} ℓ=2,
       50 → ℓ=0 (outlier), 9.5 → {10} ℓ=1. Record rule: 2.9 and 9.5. Below k: 3 of 5, 5−3 < 3, so
       the class goes: the other three by the class rule.
    B (id 7): originals 5,5.5,6,6.5; noisy 5.6, 6.0, 5.9 → ℓ=4 each; 30 → ℓ=0. Below k: 1; 4−1 ≥ 3: kept.
    C (id 1000): three sevens, scale 0 (zero diameter): ℓ = 3 each, kept.
    D (id 3): two eights, scale 0: ℓ = 2, 0 < 2 < 3, both by the record rule.
    """
    rows = [
        # class, original, noisy, scale, expected
        (40, 0.0, 1.1, 1.0, "class"),
        (7, 5.0, 5.6, 1.0, "kept"),
        (40, 1.0, 2.0, 1.0, "class"),
        (1000, 7.0, 7.0, 0.0, "kept"),
        (3, 8.0, 8.0, 0.0, "record"),
        (40, 2.0, 2.9, 1.0, "record"),
        (7, 5.5, 6.0, 1.0, "kept"),
        (40, 3.0, 50.0, 1.0, "class"),
        (1000, 7.0, 7.0, 0.0, "kept"),
        (7, 6.0, 5.9, 1.0, "kept"),
        (40, 10.0, 9.5, 1.0, "record"),
        (3, 8.0, 8.0, 0.0, "record"),
        (7, 6.5, 30.0, 1.0, "kept"),
        (1000, 7.0, 7.0, 0.0, "kept"),
    ]
    class_ids, original, noisy, scales, expected = zip(*rows)
    return np.array(class_ids), np.array(original), np.array(noisy), np.array(scales), np.array(expected)


def test_hand_built_classes():
    class_ids, original, noisy, scales, expected = hand_built()
    result = confidence_suppress(original, noisy, class_ids, scales, k=3, confidence=C_RADIUS_1_5)
    assert np.array_equal(result.record_rule, expected == "record")
    assert np.array_equal(result.class_rule, expected == "class")
    assert np.array_equal(result.removed, expected != "kept")
    assert result.report == {
        "k": 3,
        "confidence": C_RADIUS_1_5,
        "records": 14,
        "outliers_kept": 2,
        "removed_by_record_rule": 4,
        "removed_by_class_rule": 3,
        "classes_removed": 2,  # A, and D (both its rows already gone by the record rule)
        "removed": 7,
    }


def test_several_columns_union_and_classes_shrunk_below_k():
    # One class of 6, k = 3. Each column alone flags two different records (6 − 2 ≥ 3 keeps the
    # class), but together they remove four, leaving two: the class must go.
    x_original = np.array([0.0, 0.5, 1.0, 1.5, 10.0, 20.0])
    x_noisy = np.array([0.5, 0.7, 0.9, 1.0, 10.0, 20.0])
    y_original = np.array([10.0, 20.0, 0.0, 0.5, 1.0, 1.5])
    y_noisy = np.array([10.0, 20.0, 0.5, 0.7, 0.9, 1.0])
    ones = np.ones(6)
    class_ids = np.zeros(6, dtype=np.int64)
    alone = confidence_suppress(x_original, x_noisy, class_ids, ones, 3, C_RADIUS_1_5)
    assert alone.removed.tolist() == [False, False, False, False, True, True]
    result = confidence_suppress_columns(
        {"X": x_original, "Y": y_original}, {"X": x_noisy, "Y": y_noisy}, class_ids, {"X": ones, "Y": ones}, 3, C_RADIUS_1_5
    )
    assert result.record_rule.tolist() == [True, True, False, False, True, True]
    assert result.class_rule.tolist() == [False, False, True, True, False, False]
    assert result.removed.all()
    assert result.report["classes_removed_after_union"] == 1
    assert result.report["columns"]["X"]["removed_by_record_rule"] == 2


def test_several_columns_with_one_column_equals_single_column():
    original, noisy, class_ids, scales = random_release(7)
    single = confidence_suppress(original, noisy, class_ids, scales, 4, 0.95)
    multi = confidence_suppress_columns({"H": original}, {"H": noisy}, class_ids, {"H": scales}, 4, 0.95)
    assert np.array_equal(single.removed, multi.removed)
    assert np.array_equal(single.record_rule, multi.record_rule)


@pytest.mark.parametrize("k", [1, 0, -3, 2.5, True])
def test_bad_k_is_refused(k):
    with pytest.raises(SpecError) as caught:
        confidence_suppress(np.ones(3), np.ones(3), np.zeros(3, dtype=int), np.ones(3), k, 0.99)
    assert caught.value.parameter == "k"


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1, math.nan])
def test_bad_confidence_is_refused(confidence):
    with pytest.raises(SpecError) as caught:
        confidence_suppress(np.ones(3), np.ones(3), np.zeros(3, dtype=int), np.ones(3), 2, confidence)
    assert caught.value.parameter == "confidence"


def test_bad_arrays_are_refused():
    ids = np.zeros(3, dtype=int)
    with pytest.raises(SpecError) as caught:
        confidence_suppress(np.ones(3), np.ones(3), ids, np.array([1.0, -1.0, 1.0]), 2, 0.9)
    assert caught.value.parameter == "scales"
    with pytest.raises(SpecError) as caught:
        confidence_suppress(np.ones(3), np.array([1.0, np.nan, 1.0]), ids, np.ones(3), 2, 0.9)
    assert caught.value.parameter == "noisy"
    with pytest.raises(SpecError) as caught:
        confidence_suppress(np.ones(3), np.ones(2), ids, np.ones(3), 2, 0.9)
    assert caught.value.parameter == "noisy"
