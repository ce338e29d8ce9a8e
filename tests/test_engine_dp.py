"""The (ε,δ) accountant of safe k-anonymisation after sampling, against an exact rational computation."""

import math
import subprocess
import sys
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest

from kepsilon.engine.dp import gamma, minimum_epsilon, safe_k_delta, sampling_rate_for, smallest_k


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
