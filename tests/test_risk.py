"""The risk models against independent computations: brute force, direct series, the models' own
generating processes, and the closed forms published with them."""

import math
from collections import Counter
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import nbinom

from kepsilon.engine import risk
from kepsilon.engine.errors import SpecError

# --- prosecutor, journalist, marketer --------------------------------------------------------


def test_prosecutor_risk_matches_a_record_by_record_count():
    records = pd.DataFrame({"a": list("xxxyyzzzzq"), "b": [1] * 10})
    sizes = risk.group_sizes(records, ["a", "b"])
    result = risk.prosecutor_risk(sizes, threshold=0.3)
    per_record = [1 / (records["a"] == value).sum() for value in records["a"]]
    assert result["highest"] == pytest.approx(max(per_record)) == 1.0
    assert result["average"] == pytest.approx(np.mean(per_record))
    assert result["average"] == pytest.approx(4 / 10)  # J/n
    assert result["records_at_risk"] == pytest.approx(sum(r > 0.3 for r in per_record) / 10)  # the 2 y's and the q


def test_journalist_and_marketer_risk_against_known_population_counts():
    sizes = np.array([2, 3, 5])
    population = np.array([10, 3, 50])
    result = risk.journalist_risk(sizes, population, threshold=0.2)
    assert result["highest"] == pytest.approx(1 / 3)
    assert result["records_at_risk"] == pytest.approx(3 / 10)
    marketer = risk.marketer_risk(sizes, 1 / population)
    assert marketer == pytest.approx((2 / 10 + 3 / 3 + 5 / 50) / 10)
    assert result["average"] == pytest.approx(marketer)
    # A population count below the sample's is impossible: it is raised to the sample's count.
    assert risk.journalist_risk([4], [2])["highest"] == pytest.approx(1 / 4)
    assert risk.marketer_risk(sizes) == pytest.approx(3 / 10)  # the table is its own population: J/n


# --- Benedetti–Franconi ------------------------------------------------------------------------


def _series_expected_inverse(f: int, p: float) -> float:
    """E[1/(f+Y)] with Y ~ NB(f, p) by summing the series directly (independent of the module's integral)."""
    y = np.arange(0, 200_000)
    return float(np.sum(nbinom.pmf(y, f, p) / (f + y)))


@pytest.mark.parametrize("f, p", [(1, 0.01), (1, 0.5), (2, 0.1), (3, 0.05), (7, 0.3), (25, 0.02), (60, 0.9)])
def test_individual_risk_equals_the_negative_binomial_series(f, p):
    computed = risk.individual_risk([f], [f / p])[0]
    assert computed == pytest.approx(_series_expected_inverse(f, p), rel=1e-7)


def test_individual_risk_closed_forms_of_benedetti_franconi():
    # f = 1: p·ln(1/p)/(1−p); f = 2: p/(1−p) − (p/(1−p))²·ln(1/p) (Benedetti and Franconi 1998).
    p = 0.2
    ratio = p / (1 - p)
    assert risk.individual_risk([1], [1 / p])[0] == pytest.approx(ratio * math.log(1 / p), rel=1e-10)
    assert risk.individual_risk([2], [2 / p])[0] == pytest.approx(ratio - ratio**2 * math.log(1 / p), rel=1e-9)
    # No sampling (weights 1): the prosecutor risk 1/f.
    assert list(risk.individual_risk([1, 4, 10], [1, 4, 10])) == pytest.approx([1, 0.25, 0.1])


def test_individual_risk_refuses_bad_weights():
    with pytest.raises(SpecError, match="weights"):
        risk.individual_risk([2, 3], [1.0])


# --- population uniqueness -----------------------------------------------------------------


def test_pitman_likelihood_closed_form_equals_the_direct_sums():
    histogram = {1: 40, 2: 12, 3: 5, 7: 2}
    theta, alpha = 13.7, 0.42
    u = sum(histogram.values())
    n = sum(s * c for s, c in histogram.items())
    direct = (
        sum(math.log(theta + i * alpha) for i in range(1, u))
        - sum(math.log(theta + i) for i in range(1, n))
        + sum(c * sum(math.log(l - alpha) for l in range(1, s)) for s, c in histogram.items())
    )
    assert risk.pitman_log_likelihood(theta, alpha, histogram) == pytest.approx(direct, rel=1e-12)


def _chinese_restaurant(theta: float, alpha: float, n: int, rng) -> np.ndarray:
    """Class of each of n customers of a Pitman–Yor Chinese restaurant process."""
    tables: list[int] = []
    seats = np.empty(n, dtype=np.int64)
    for i in range(n):
        if rng.random() < (theta + alpha * len(tables)) / (theta + i):
            tables.append(1)
            seats[i] = len(tables) - 1
        else:
            weights = np.asarray(tables, dtype=np.float64) - alpha
            choice = int(np.searchsorted(np.cumsum(weights), rng.random() * weights.sum()))
            tables[choice] += 1
            seats[i] = choice
    return seats


def test_pitman_recovers_a_simulated_population_uniques():
    rng = np.random.default_rng(7)
    population = _chinese_restaurant(200.0, 0.6, 60_000, rng)
    sample = population[:6_000]  # exchangeable: the first n customers are a random sample (π = 10 %)
    sizes = np.bincount(sample)
    sizes = sizes[sizes > 0]
    theta, alpha = risk.pitman_parameters(risk.size_histogram(sizes))
    assert alpha == pytest.approx(0.6, abs=0.1)
    true_uniques = int((np.bincount(population) == 1).sum())
    estimate = risk.pitman_uniques(risk.size_histogram(sizes), len(population))
    assert estimate == pytest.approx(true_uniques, rel=0.15)


def test_pitman_uniques_formula_is_the_limit_of_the_exact_expectation():
    # Exact expected singletons of a Pitman process of N: N·Γ(θ+1)Γ(θ+α+N−1)/(Γ(θ+α)Γ(θ+N)).
    from scipy.special import gammaln

    theta, alpha, population = 200.0, 0.6, 60_000
    exact = population * math.exp(
        gammaln(theta + 1) + gammaln(theta + alpha + population - 1) - gammaln(theta + alpha) - gammaln(theta + population)
    )
    asymptotic = math.exp(gammaln(theta + 1) - gammaln(theta + alpha) + alpha * math.log(population))
    assert asymptotic == pytest.approx(exact, rel=0.01)


def _hypergeometric_one(N: int, j: int, n: int) -> float:
    return j * math.comb(N - j, n - 1) / math.comb(N, n)


def test_zayatz_against_its_formula_with_exact_binomials():
    histogram = {1: 6, 2: 3, 4: 1}
    sample, population = 16, 80
    u = 10
    numerator = (6 / u) * _hypergeometric_one(population, 1, sample)
    denominator = sum((c / u) * _hypergeometric_one(population, s, sample) for s, c in histogram.items())
    expected = 6 * (numerator / denominator) / (sample / population)
    assert risk.zayatz_uniques(histogram, sample, population) == pytest.approx(expected, rel=1e-10)


def test_snb_solves_the_counts_its_own_model_generates():
    alpha, beta, classes, fraction = 0.7, 0.3, 5_000.0, 0.2
    # Expected sample counts by direct summation over population class sizes F = 1 + NB(α, β).
    F = np.arange(1, 5_000)
    pmf = nbinom.pmf(F - 1, alpha, beta)
    c1 = classes * np.sum(pmf * F * fraction * (1 - fraction) ** (F - 1))
    c2 = classes * np.sum(pmf * F * (F - 1) / 2 * fraction**2 * (1 - fraction) ** (F - 2))
    assert risk.snb_expected_counts(alpha, beta, classes, fraction) == pytest.approx((c1, c2), rel=1e-9)
    assert risk.snb_uniques_given(c1, c2, classes, fraction) == pytest.approx(classes * beta**alpha, rel=1e-6)


def test_shlosser_estimate_of_classes():
    histogram = {1: 10, 2: 4, 3: 1}
    q = 0.25
    expected = 15 + 10 * (10 * 0.75 + 4 * 0.75**2 + 0.75**3) / (10 * q + 4 * 2 * q * 0.75 + 3 * q * 0.75**2)
    assert risk.shlosser_classes(histogram, q) == pytest.approx(expected)


def test_dankar_rule_picks_as_published():
    estimates = {"pitman": 120.0, "zayatz": 90.0, "snb": 100.0}
    assert risk.dankar_choice(estimates, 0.05) == ("pitman", 120.0)
    assert risk.dankar_choice({**estimates, "pitman": None}, 0.05) == ("zayatz", 90.0)
    assert risk.dankar_choice(estimates, 0.3) == ("zayatz", 90.0)
    assert risk.dankar_choice({**estimates, "zayatz": 150.0}, 0.3) == ("snb", 100.0)
    assert risk.dankar_choice({**estimates, "snb": None}, 0.3) == ("zayatz", 90.0)


def test_population_uniqueness_without_sample_uniques_is_zero_and_refuses_small_population():
    assert risk.population_uniqueness([2, 3, 5], 100)["population_uniques"] == 0.0
    with pytest.raises(SpecError, match="population"):
        risk.population_uniqueness([2, 3], 4)


# --- SUDA ----------------------------------------------------------------------------------


def _brute_force_msus(frame: pd.DataFrame, columns, max_size):
    """Every record × every column set: unique, and no proper subset unique (SUDA's definition)."""
    rows = [tuple(r) for r in frame[columns].itertuples(index=False)]
    index = {c: i for i, c in enumerate(columns)}
    found: dict[tuple[str, ...], set[int]] = {}
    for size in range(1, max_size + 1):
        for combo in combinations(columns, size):
            counts = Counter(tuple(row[index[c]] for c in combo) for row in rows)
            for r, row in enumerate(rows):
                if counts[tuple(row[index[c]] for c in combo)] != 1:
                    continue
                minimal = True
                for smaller in range(1, size):
                    for subset in combinations(combo, smaller):
                        sub_counts = Counter(tuple(x[index[c]] for c in subset) for x in rows)
                        if sub_counts[tuple(row[index[c]] for c in subset)] == 1:
                            minimal = False
                if minimal:
                    found.setdefault(combo, set()).add(r)
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_minimal_sample_uniques_match_exhaustive_enumeration(seed):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({c: rng.integers(0, levels, 40).astype(str) for c, levels in zip("abcd", (2, 3, 4, 6))})
    msus = risk.minimal_sample_uniques(frame, list("abcd"), 3)
    computed = {combo: set(np.flatnonzero(mask)) for combo, mask in msus.items()}
    assert computed == _brute_force_msus(frame, list("abcd"), 3)


def test_suda_scores_weigh_smaller_msus_more():
    # Elliot et al.'s worked example shape: A = 4 columns, M = 3; an MSU of size 1 scores 3·2 = 6,
    # of size 2 scores 2, of size 3 scores 1.
    frame = pd.DataFrame({"a": ["x", "y", "y", "y"], "b": ["1", "1", "2", "2"], "c": ["p", "p", "p", "q"], "d": ["0"] * 4})
    msus = risk.minimal_sample_uniques(frame, list("abcd"), 3)
    scores = risk.suda_scores(msus, 4, 4, 3)
    expected = np.zeros(4)
    for combo, rows in _brute_force_msus(frame, list("abcd"), 3).items():
        for r in rows:
            expected[r] += {1: 6, 2: 2, 3: 1}[len(combo)]
    assert list(scores) == list(expected)
    assert scores[0] >= 6  # record 0 is the only x: an MSU of size 1
    summary = risk.special_uniques(frame, list("abcd"), 3)
    assert summary["records_with_msu"] == int((expected > 0).sum())
    assert summary["combinations"][0]["records"] >= 1


@pytest.mark.parametrize("seed", [5, 6])
def test_special_uniques_on_a_histogram_equal_those_on_its_records(seed):
    """The Dask engine holds the source as distinct tuples with counts: SUDA on them, weighted, gives the records' figures."""
    rng = np.random.default_rng(seed)
    records = pd.DataFrame({c: rng.choice(list("abcdefgh")[: 3 + 2 * i], 200) for i, c in enumerate("wxyz")})
    histogram = records.value_counts(sort=False).rename("records").reset_index()
    on_records = risk.special_uniques(records, list("wxyz"), max_size=3, top=50)
    on_histogram = risk.special_uniques(histogram[list("wxyz")], list("wxyz"), max_size=3, top=50,
                                        weights=histogram["records"].to_numpy())
    assert on_histogram["score_mean"] == pytest.approx(on_records.pop("score_mean"))
    assert {k: v for k, v in on_histogram.items() if k != "score_mean"} == on_records
    assert on_records["records_with_msu"] > 0 and len(histogram) < len(records)


@pytest.mark.parametrize("seed", [7, 8])
def test_special_uniques_added_up_over_parts_of_rows_equal_those_of_the_whole(seed):
    """The Dask engine's split: each part finds its MSUs from uniqueness over the whole table, the parts'
    figures are added up; a record-by-record count of uniqueness here, not the engine's."""
    rng = np.random.default_rng(seed)
    records = pd.DataFrame({c: rng.choice(list("abcdefgh")[: 3 + 2 * i], 150) for i, c in enumerate("wxyz")})
    whole = risk.special_uniques(records, list("wxyz"), max_size=3, top=50)
    cuts = np.sort(rng.choice(np.arange(1, 150), 3, replace=False))
    parts = []
    for rows in np.split(np.arange(150), cuts):
        def unique_on(combo, rows=rows):
            keys = [tuple(row) for row in records[list(combo)].itertuples(index=False)]
            counts = Counter(keys)
            return np.array([counts[keys[i]] == 1 for i in rows])
        msus = risk.minimal_sample_uniques_given(list("wxyz"), 3, unique_on)
        parts.append(risk.special_uniques_part(msus, len(rows), list("wxyz"), 3))
    assert risk.special_uniques_of_parts(parts, list("wxyz"), 3, top=50) == whole
    assert whole["records_with_msu"] > 0


def test_risk_from_the_frequency_of_frequencies_equals_the_groups():
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 9, 400)
    halves = [risk.size_histogram(sizes[:170]), risk.size_histogram(sizes[170:])]
    counts = risk.add_size_counts(halves)
    assert counts == risk.size_histogram(sizes) and list(counts) == sorted(counts)
    by_group, by_count = risk.prosecutor_risk(sizes, 0.3), risk.prosecutor_risk_of_size_counts(counts, 0.3)
    assert by_count["highest"] == by_group["highest"] == 1.0
    assert by_count["records_at_risk"] == by_group["records_at_risk"] == sizes[sizes < 1 / 0.3].sum() / sizes.sum()
    assert by_count["average"] == pytest.approx(len(sizes) / sizes.sum(), rel=1e-15)
    assert risk.population_uniqueness_of_size_counts(counts, 20 * int(sizes.sum())) == \
        risk.population_uniqueness(sizes, 20 * int(sizes.sum()))
