"""The utility report's measures against hand computations and direct definitions."""

import math

import numpy as np
import pandas as pd
import pytest

from kepsilon.engine import risk, utility
from kepsilon.engine.hierarchy import load_hierarchy


@pytest.fixture
def tree(tmp_path):
    # {a,b,c} {d,e} {f} under *.
    path = tmp_path / "h.csv"
    path.write_text("a;ABC;*\nb;ABC;*\nc;ABC;*\nd;DE;*\ne;DE;*\nf;F;*\n")
    return load_hierarchy(path, "x")


def test_total_variation_by_hand():
    source = pd.Series(list("aaab"))
    released = pd.Series(list("abbc"))
    # p = (3/4, 1/4, 0), q = (1/4, 2/4, 1/4): ½(2/4 + 1/4 + 1/4) = 1/2.
    assert utility.total_variation(source, released) == pytest.approx(0.5)
    assert utility.total_variation(source, source.sample(frac=1, random_state=1)) == 0.0


def test_numeric_distances_against_their_definitions():
    rng = np.random.default_rng(3)
    source = rng.normal(50, 10, 400)
    released = source + rng.laplace(0, 3, 400)
    measured = utility.numeric_distances(source, released, span=100.0)
    # Equal sample sizes: W1 is the mean distance between the sorted samples.
    assert measured["wasserstein"] == pytest.approx(np.mean(np.abs(np.sort(source) - np.sort(released))))
    assert measured["wasserstein_of_range"] == pytest.approx(measured["wasserstein"] / 100)
    points = np.sort(np.concatenate([source, released]))
    ecdf = lambda sample: np.searchsorted(np.sort(sample), points, side="right") / len(sample)  # noqa: E731
    assert measured["ks"] == pytest.approx(np.max(np.abs(ecdf(source) - ecdf(released))))
    # Snapping to a grid: values already on it are at distance 0 from themselves.
    on_grid = np.round(source / 0.5) * 0.5
    assert utility.numeric_distances(source, on_grid, grid=0.5)["wasserstein"] == 0.0


def test_correlation_change():
    rng = np.random.default_rng(4)
    x = rng.normal(size=500)
    source = pd.DataFrame({"x": x, "y": 2 * x + rng.normal(scale=0.1, size=500)})
    released = pd.DataFrame({"x": x, "y": rng.normal(size=500)})
    change = utility.correlation_change(source, released, ["x", "y"])
    assert change["pairs"][0]["before"] == pytest.approx(np.corrcoef(source.x, source.y)[0, 1])
    assert change["largest_change"] == pytest.approx(abs(np.corrcoef(x, released.y)[0, 1] - change["pairs"][0]["before"]))
    assert utility.correlation_change(source, released, ["x"]) is None


def test_granularity_and_non_uniform_entropy_by_hand(tree):
    values = pd.Series(list("abdf"))
    labels = pd.Series(["a", "ABC", "*", "F"])
    # Leaves covered: 1, 3, 6, 1 of 6 → losses 0, 2/5, 1, 0 → granularity 1 − 1.4/4.
    assert utility.granularity(values, labels, tree) == pytest.approx(1 - 1.4 / 4)
    assert utility.granularity(values, values, tree) == 1.0
    # Labels ABC over {a, a, b}: P(a|ABC) = 2/3, P(b|ABC) = 1/3; D alone under * : 0 bits.
    entropy = utility.non_uniform_entropy(pd.Series(list("aabd")), pd.Series(["ABC", "ABC", "ABC", "*"]))
    assert entropy == pytest.approx((2 * -math.log2(2 / 3) - math.log2(1 / 3)) / 4)
    assert utility.discernibility([2, 3], suppressed=1, total=6) == 4 + 9 + 6


def test_classifier_utility_sees_what_generalisation_took_away():
    rng = np.random.default_rng(5)
    n = 1000
    key = rng.choice(list("abcdef"), n)
    source = pd.DataFrame({"x": key, "noise": rng.normal(size=n), "y": np.where(np.isin(key, ["a", "b", "c"]), "yes", "no")})
    # Released with x generalised away entirely: no model can predict y from it.
    released = source.assign(x="*")
    result = utility.classifier_utility(source, released, "y", numeric=["noise"])
    assert result["computed"]
    for model in result["models"].values():
        assert model["source"] == 1.0
        assert model["released"] <= result["baseline"] + 0.08  # chance, give or take what the noise column fits
        assert model["relative"] < 0.2
    # Released with x generalised one level (ABC / DE / F): y is still a function of it.
    kept = utility.classifier_utility(source, source.assign(x=np.where(np.isin(key, ["a", "b", "c"]), "ABC", "DEF")), "y", ["noise"])
    assert all(model["released"] == 1.0 for model in kept["models"].values())


def test_population_group_sizes_count_consistent_people(tree):
    groups = pd.DataFrame({"x": ["ABC", "d", "*"]})
    population = pd.DataFrame({"x": list("abcdef"), "count": [10, 20, 30, 5, 1, 2]})
    sizes = risk.population_group_sizes(groups, population, {"x": tree})
    assert list(sizes) == [60, 5, 68]
