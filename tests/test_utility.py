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


# --- the same measures from counts, as the Dask engine's partitions add them up --------------------------


def test_measures_from_counts_equal_the_measures_on_the_records(tree):
    rng = np.random.default_rng(11)
    n = 700
    # Categories with a missing value; numbers on a grid of 0.5; two aligned numeric columns.
    source_text = pd.Series(rng.choice(["x", "y", "z", None], n))
    released_text = source_text.sample(frac=0.8, random_state=2)
    assert utility.total_variation_from_counts(
        source_text.astype("string").fillna("\x00missing").value_counts(),
        released_text.astype("string").fillna("\x00missing").value_counts(),
    ) == pytest.approx(utility.total_variation(source_text, released_text))

    source = rng.normal(40, 8, n)
    released = np.round((source + rng.laplace(0, 2, n)) / 0.5) * 0.5
    snapped = pd.Series(np.round(source / 0.5) * 0.5).value_counts()
    from_counts = utility.numeric_distances_from_counts(snapped, pd.Series(released).value_counts(), span=80.0)
    on_records = utility.numeric_distances(source, released, grid=0.5, span=80.0)
    for name in ("wasserstein", "wasserstein_of_range", "ks"):
        assert from_counts[name] == pytest.approx(on_records[name], rel=1e-9, abs=1e-12)

    before = pd.DataFrame({"a": source, "b": 0.5 * source + rng.normal(size=n), "c": rng.normal(size=n)})
    after = before + rng.laplace(0, 3, (n, 3))
    halves = [slice(0, 300), slice(300, n)]  # two partitions' moments added up
    expected = utility.correlation_change(before, after, ["a", "b", "c"])
    added = utility.correlations_from_moments(
        ["a", "b", "c"], utility.add_moments([utility.moments(before.iloc[h], ["a", "b", "c"]) for h in halves]),
        utility.add_moments([utility.moments(after.iloc[h], ["a", "b", "c"]) for h in halves]))
    for mine, theirs in zip(added["pairs"], expected["pairs"]):
        assert mine["columns"] == theirs["columns"]
        assert mine["before"] == pytest.approx(theirs["before"], abs=1e-9)
        assert mine["after"] == pytest.approx(theirs["after"], abs=1e-9)

    values = pd.Series(rng.choice(list("abcdef"), n))
    level = rng.integers(0, 3, n)  # each record released at its own level: value, group, or *
    labels = pd.Series([tree.labels[lv][tree.leaf_codes(pd.Series([v]))[0]] for v, lv in zip(values, level)])
    pairs = pd.DataFrame({"value": values, "label": labels}).value_counts().rename("records").reset_index()
    measured = utility.generalisation_from_pairs(pairs, tree)
    assert measured["granularity"] == pytest.approx(utility.granularity(values, labels, tree))
    assert measured["non_uniform_entropy_bits"] == pytest.approx(utility.non_uniform_entropy(values, labels))
    assert measured["released_as_read"] == pytest.approx((values == labels).mean())
    assert 0 < measured["granularity"] < 1
