"""The DP mode's engine: the (ε,δ) accountant against exact rational arithmetic, and the evidence that
the sampler, safe k-anonymisation and the exponential mechanism behave as the guarantee assumes."""

import math
import subprocess
import sys
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, chisquare

from kepsilon.engine.dp import (
    bernoulli_sample,
    exponential_mechanism,
    exponential_mechanism_probabilities,
    gamma,
    minimum_epsilon,
    safe_k_anonymise,
    safe_k_delta,
    sampling_rate_for,
    smallest_k,
)


def exact_delta(k: int, beta: Fraction, epsilon: Decimal, n_last: int) -> float:
    """d(k, β, ε) by brute force: exact binomial tails (integers and fractions), max over n up to n_last.

    γ is computed in 60-digit decimals so that floor(γn) is exact wherever float arithmetic could round.
    """
    getcontext().prec = 60
    g = 1 - (1 - Decimal(beta.numerator) / Decimal(beta.denominator)) * (-epsilon).exp()
    first = max(1, math.ceil(Decimal(k) / g - 1))
    largest = Fraction(0)
    for n in range(first, n_last + 1):
        threshold = int((g * n).to_integral_value(rounding="ROUND_FLOOR"))
        p, q = beta.numerator, beta.denominator
        successes = sum(math.comb(n, j) * p**j * (q - p) ** (n - j) for j in range(threshold + 1, n + 1))
        largest = max(largest, Fraction(successes, q**n))
    return float(largest)


@pytest.mark.parametrize(
    "k, beta, epsilon",
    [(5, Fraction(1, 10), "0.2"), (10, Fraction(1, 10), "1"), (20, Fraction(1, 2), "1"), (40, Fraction(1, 5), "0.5")],
)
def test_delta_equals_the_exact_maximum_of_binomial_tails(k, beta, epsilon):
    computed = safe_k_delta(k, float(beta), float(epsilon))
    reference = exact_delta(k, beta, Decimal(epsilon), n_last=600)
    assert computed == pytest.approx(reference, rel=1e-9)
    assert computed > 0


def test_tiny_deltas_do_not_underflow():
    # δ near 1e-30 and below is still a positive number matching the exact computation.
    computed = safe_k_delta(75, 0.1, 0.5)
    reference = exact_delta(75, Fraction(1, 10), Decimal("0.5"), n_last=800)
    assert 1e-32 < computed < 1e-30
    assert computed == pytest.approx(reference, rel=1e-9)


def test_delta_does_not_increase_with_k_and_smallest_k_inverts_it():
    beta, epsilon = sampling_rate_for(1.0), 1.0
    deltas = [safe_k_delta(k, beta, epsilon) for k in range(2, 120)]
    assert all(later <= earlier for earlier, later in zip(deltas, deltas[1:]))
    k = smallest_k(1e-6, beta, epsilon)
    assert safe_k_delta(k, beta, epsilon) <= 1e-6 < safe_k_delta(k - 1, beta, epsilon)


def test_sampling_rate_is_the_largest_the_theorem_admits():
    beta = sampling_rate_for(1.0)
    assert beta == pytest.approx(1 - math.exp(-1.0))
    assert minimum_epsilon(beta) == pytest.approx(1.0)
    assert gamma(0.1, 1.0) == pytest.approx((math.e - 1 + 0.1) / math.e)


@pytest.mark.parametrize(
    "k, beta, epsilon, parameter",
    [(0, 0.1, 1.0, "k"), (2.5, 0.1, 1.0, "k"), (5, 0.0, 1.0, "beta"), (5, 1.0, 1.0, "beta"),
     (5, 0.1, 0.0, "epsilon"), (5, 0.1, math.inf, "epsilon"), (5, 0.5, 0.5, "epsilon must be at least")],
)
def test_parameters_outside_the_theorem_are_refused_by_name(k, beta, epsilon, parameter):
    with pytest.raises(ValueError, match=parameter):
        safe_k_delta(k, beta, epsilon)


def test_the_engine_imports_without_the_orchestrator():
    code = "import kepsilon.engine.dp, sys; assert not {'prefect', 'great_expectations'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the mechanism's building blocks: evidence ------------------------------------------------------


def test_the_sampler_keeps_records_at_rate_beta():
    rng = np.random.default_rng(11)
    for beta in (0.05, 0.5, sampling_rate_for(1.0)):
        kept = bernoulli_sample(200_000, beta, rng)
        assert binomtest(int(kept.sum()), kept.size, beta).pvalue > 1e-3


def test_safe_k_anonymisation_publishes_no_group_below_k():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 40, size=(2_000, 2))  # two generalised columns, many small groups
    kept = safe_k_anonymise(keys, 5)
    sizes = pd.DataFrame(keys).groupby([0, 1]).size()  # independent group count
    size_of = pd.DataFrame(keys).merge(sizes.rename("n").reset_index(), on=[0, 1], how="left")["n"].to_numpy()
    assert (size_of[kept] >= 5).all() and (size_of[~kept] < 5).all()
    assert 0 < kept.sum() < kept.size


def test_exponential_mechanism_selects_with_its_stated_probabilities():
    scores = np.array([0.0, 3.0, 5.0, 5.0, 8.0, 12.0])  # a tiny lattice of six nodes
    probabilities = exponential_mechanism_probabilities(scores, epsilon=1.0, sensitivity=2.0)
    assert probabilities == pytest.approx(np.exp(scores / 4) / np.exp(scores / 4).sum())
    rng = np.random.default_rng(8)
    draws = np.bincount([exponential_mechanism(scores, 1.0, 2.0, rng) for _ in range(20_000)], minlength=6)
    assert chisquare(draws, 20_000 * probabilities).pvalue > 1e-3
    # The same test rejects the frequencies of a mechanism at twice the ε: it can fail.
    wrong = exponential_mechanism_probabilities(scores, epsilon=2.0, sensitivity=2.0)
    assert chisquare(draws, 20_000 * wrong).pvalue < 1e-6


def published_counts(group_size: int, beta: float, k: int, runs: int, rng) -> np.ndarray:
    """The published size of one group over many runs of sample-then-safe-k (0 when suppressed)."""
    sampled = (rng.random((runs, group_size)) < beta).sum(axis=1)
    return np.where(sampled >= k, sampled, 0)


def worst_event_excess(counts_d: np.ndarray, counts_d_prime: np.ndarray, epsilon: float) -> float:
    """max over output events c of P(c) − e^ε·P′(c) − 4 standard errors, in both directions.

    A value above δ means the (ε, δ) bound is violated beyond sampling error.
    """
    runs = counts_d.size
    worst = -1.0
    for c in np.union1d(counts_d, counts_d_prime):
        p, q = (counts_d == c).mean(), (counts_d_prime == c).mean()
        error = 4 * math.sqrt((p * (1 - p) + math.exp(2 * epsilon) * q * (1 - q)) / runs)
        error_reverse = 4 * math.sqrt((q * (1 - q) + math.exp(2 * epsilon) * p * (1 - p)) / runs)
        worst = max(worst, p - math.exp(epsilon) * q - error, q - math.exp(epsilon) * p - error_reverse)
    return worst


@pytest.mark.parametrize("group_size", [0, 4, 9, 10, 20])
def test_neighbouring_data_sets_give_output_probabilities_within_e_to_the_epsilon_up_to_delta(group_size):
    """D′ = D plus one record in a group of ``group_size``; only that group's published size can differ."""
    epsilon, k = 1.0, 10
    beta = sampling_rate_for(epsilon)
    delta = safe_k_delta(k, beta, epsilon)
    rng = np.random.default_rng(group_size)
    runs = 20_000
    without_target = published_counts(group_size, beta, k, runs, rng)
    with_target = published_counts(group_size + 1, beta, k, runs, rng)
    assert worst_event_excess(without_target, with_target, epsilon) <= delta


def test_the_privacy_check_catches_a_mechanism_that_publishes_small_groups():
    # Sampling alone (no suppression of groups below k) publishes a lone target with probability β.
    epsilon = 1.0
    beta = sampling_rate_for(epsilon)
    rng = np.random.default_rng(1)
    without_target = published_counts(0, beta, 1, 20_000, rng)
    with_target = published_counts(1, beta, 1, 20_000, rng)
    assert worst_event_excess(without_target, with_target, epsilon) > safe_k_delta(10, beta, epsilon)


def test_the_default_sampling_rate_passes_the_theorem_s_check_at_every_epsilon():
    # 1 − e^(−ε) rounds above the admissible β for about a third of all ε; the rate is rounded down then.
    for epsilon in np.linspace(0.01, 5, 2_000):
        assert minimum_epsilon(sampling_rate_for(float(epsilon))) <= epsilon


def test_the_monotone_exponential_mechanism_drops_the_factor_two():
    scores = np.array([0.0, 3.0, 5.0])
    monotone = exponential_mechanism_probabilities(scores, epsilon=1.0, sensitivity=2.0, monotone=True)
    assert monotone == pytest.approx(np.exp(scores / 2) / np.exp(scores / 2).sum())


