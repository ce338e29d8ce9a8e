"""Loss and risk metrics against hand computations and naive references."""

import math

import numpy as np
import pandas as pd
import pytest

from kepsilon.tasks.errors import InputError, SpecError
from kepsilon.tasks.metrics import (
    class_statistics,
    linked_records,
    linking_risk,
    measured_relative_error,
    predicted_relative_error,
)


def naive_linked(original, noisy, class_ids):
    """O(m²) per class reference of nearest-neighbour linking."""
    linked = np.zeros(len(original), dtype=bool)
    for cls in np.unique(class_ids):
        rows = np.flatnonzero(class_ids == cls)
        distances = np.abs(noisy[rows][:, None] - original[rows][None, :])
        linked[rows] = np.abs(noisy[rows] - original[rows]) == distances.min(axis=1)
    return linked


def random_classes(seed, n_classes=250):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 30, size=n_classes)
    class_ids = np.repeat(rng.choice(10**6, size=n_classes, replace=False), sizes)
    rng.shuffle(class_ids)
    original = np.round(rng.normal(170, 8, size=len(class_ids)), 0)  # many ties
    noisy = np.round(original + rng.laplace(0, 4, size=len(class_ids)), 1)
    return original, noisy, class_ids


@pytest.mark.parametrize("seed", range(5))
def test_linking_equals_naive_reference(seed):
    original, noisy, class_ids = random_classes(seed)
    fast = linked_records(original, noisy, class_ids)
    reference = naive_linked(original, noisy, class_ids)
    assert np.array_equal(fast, reference)
    assert 0 < reference.mean() < 1
    assert linking_risk(original, noisy, class_ids) == pytest.approx(reference.mean())


def test_linking_by_hand():
    # Class 5: 1.4 is nearest its own 1 (linked); 2.6 is nearer 3 than its own 2 (not); 2.9 is
    # nearest its own 3 (linked). Class 9: a lone record is always linked.
    original = np.array([1.0, 2.0, 3.0, 100.0])
    noisy = np.array([1.4, 2.6, 2.9, 140.0])
    class_ids = np.array([5, 5, 5, 9])
    assert linked_records(original, noisy, class_ids).tolist() == [True, False, True, True]
    assert linking_risk(original, noisy, class_ids) == 0.75


def test_measured_error_by_hand():
    assert measured_relative_error([1.0, 2.0, -4.0], [1.1, 1.8, -4.4]) == pytest.approx(0.1)


def test_predicted_error_matches_harmonic_mean_formula():
    rng = np.random.default_rng(11)
    class_ids = rng.integers(0, 40, size=2000) * 3
    original = rng.uniform(140, 200, size=2000)
    epsilon = 0.7
    frame = pd.DataFrame({"c": class_ids, "v": original})
    total = 0.0
    for _, group in frame.groupby("c"):
        diameter = group["v"].max() - group["v"].min()
        harmonic = len(group) / (1 / group["v"].abs()).sum()
        total += diameter / harmonic * len(group) / len(frame)
    assert predicted_relative_error(original, class_ids, epsilon) == pytest.approx(total / epsilon, rel=1e-12)


def test_zero_values_are_refused_by_name():
    with pytest.raises(InputError) as caught:
        measured_relative_error([0.0, 2.0], [0.5, 2.0], column="HEIGHT")
    assert caught.value.column == "HEIGHT"
    with pytest.raises(InputError) as caught:
        predicted_relative_error([0.0, 2.0], [0, 0], 1.0, column="HEIGHT")
    assert caught.value.column == "HEIGHT"


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.inf, math.nan])
def test_predicted_error_refuses_bad_epsilon(epsilon):
    with pytest.raises(SpecError) as caught:
        predicted_relative_error([1.0, 2.0], [0, 0], epsilon)
    assert caught.value.parameter == "epsilon"


def test_class_statistics_by_hand():
    stats = class_statistics(np.array([5, 5, 5, 9, 9, 9, 9, 2, 2, 2]), n_suppressed=3)
    assert stats == {
        "n_classes": 3,
        "records_kept": 10,
        "records_suppressed": 3,
        "smallest_class": 3,
        "largest_class": 4,
        "mean_class_size": pytest.approx(10 / 3),
        "discernibility": 9 + 16 + 9 + 3 * 13,
        # mean over records of 1/|ec|: (3·1/3 + 4·1/4 + 3·1/3) / 10
        "prosecutor_risk_mean": pytest.approx(0.3),
        "prosecutor_risk_max": pytest.approx(1 / 3),
    }


def test_class_statistics_refuses_bad_suppressed_count():
    with pytest.raises(SpecError) as caught:
        class_statistics(np.array([0, 0]), n_suppressed=-1)
    assert caught.value.parameter == "n_suppressed"
