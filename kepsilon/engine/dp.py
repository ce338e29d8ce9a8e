"""The (ε,δ) accountant of safe k-anonymisation after random sampling (Li, Qardaji and Su 2012).

Their theorem: sampling each record with probability β, then any *strongly safe* k-anonymisation (the
generalisation chosen without looking at the data, every group smaller than k suppressed) satisfies
(ε,δ)-differential privacy for every ε ≥ −ln(1 − β), with

    γ = (e^ε − 1 + β) / e^ε
    δ = d(k, β, ε) = max over n ≥ ⌈k/γ − 1⌉ of  Σ_{j > γn} f(j; n, β),

f(j; n, β) being the binomial probability of j successes in n trials. This module computes d exactly
(to double precision) and the inverses a steward needs, and holds the mechanism's building blocks:
Bernoulli sampling, safe k-anonymisation of generalised keys, and the exponential mechanism for a
differentially private choice of the generalisation (SafePub's idea; its score:
``kepsilon.engine.dp_quality``). It imports only numpy and scipy, so a notebook, a test or a worker can use it alone.
"""

import math
import numbers

import numpy as np

_CHUNK = 4096  # population sizes evaluated per vectorised step of the search over n
_LOG_SMALLEST_DOUBLE = math.log(5e-324)


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError("k must be an integer of at least 1")


def _check_beta(beta: float) -> None:
    if not (isinstance(beta, numbers.Real) and math.isfinite(beta) and 0 < beta < 1):
        raise ValueError("beta must be a sampling probability strictly between 0 and 1")


def _check_epsilon(epsilon: float) -> None:
    if not (isinstance(epsilon, numbers.Real) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be a finite number above 0")


def _check_parameters(k: int, beta: float, epsilon: float) -> None:
    """Refuse parameters outside the theorem, naming the parameter (never a data value)."""
    _check_k(k)
    _check_beta(beta)
    _check_epsilon(epsilon)
    if epsilon < minimum_epsilon(beta):
        raise ValueError("epsilon must be at least -ln(1 - beta) for the theorem to hold at this beta")


def minimum_epsilon(beta: float) -> float:
    """The smallest ε the theorem admits at sampling rate β: −ln(1 − β)."""
    return -math.log1p(-beta)


def sampling_rate_for(epsilon: float) -> float:
    """The largest sampling rate the theorem admits at ε, β = 1 − e^(−ε) (SafePub's choice).

    Sampling more records keeps more of the data; this is the most the guarantee allows. Rounded
    down where floating point would otherwise give a β whose −ln(1 − β) exceeds ε by an ulp (a third
    of all ε do), so the result always passes the theorem's check at ε.
    """
    _check_epsilon(epsilon)
    beta = -math.expm1(-epsilon)
    while minimum_epsilon(beta) > epsilon:
        beta = math.nextafter(beta, 0.0)
    return beta


def gamma(beta: float, epsilon: float) -> float:
    """γ = (e^ε − 1 + β)/e^ε, written as 1 − (1 − β)e^(−ε) so that small ε loses no digits."""
    return 1.0 - (1.0 - beta) * math.exp(-epsilon)


def _tails(n: np.ndarray, beta: float, g: float) -> np.ndarray:
    """P(X > γn) for X ~ Binomial(n, β), for each n: the upper tail past floor(γn)."""
    from scipy.stats import binom  # 0.7 s to import; only the accountant needs it

    return binom.sf(np.floor(g * n), n, beta)


def _kl_bernoulli(p: float, q: float) -> float:
    """Kullback–Leibler divergence between Bernoulli(p) and Bernoulli(q), p and q in (0, 1)."""
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def safe_k_delta(k: int, beta: float, epsilon: float) -> float:
    """δ of safe k-anonymisation after sampling at rate β, at ε (Li, Qardaji and Su's d(k, β, ε)).

    The maximum runs over every n ≥ ⌈k/γ − 1⌉. It is found exactly: tails are evaluated in vectorised
    chunks of n, and the search stops once the Chernoff bound e^(−n·KL(γ‖β)), which bounds every
    later tail (γ > β always), falls below the largest tail found. scipy's binomial survival function
    keeps relative precision far below 1e-30, so small δ do not underflow to 0.
    """
    _check_parameters(k, beta, epsilon)
    g = gamma(beta, epsilon)
    first = max(1, math.ceil(k / g - 1))
    divergence = _kl_bernoulli(g, beta)
    largest = 0.0
    start = first
    while True:
        n = np.arange(start, start + _CHUNK, dtype=np.float64)
        largest = max(largest, float(_tails(n, beta, g).max()))
        start += _CHUNK
        # Every n ≥ start has a tail of at most exp(−start·KL): once that is below the maximum, stop.
        log_bound = -start * divergence
        if largest > 0 and log_bound <= math.log(largest):
            return largest
        if largest == 0 and log_bound < _LOG_SMALLEST_DOUBLE:
            return 0.0


def smallest_k(delta: float, beta: float, epsilon: float, k_max: int = 1_000_000) -> int:
    """The smallest k whose δ at (β, ε) is at most ``delta``.

    d(k, β, ε) does not increase with k (a larger k maximises over fewer n), so a binary search finds it.
    """
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ValueError("delta must be strictly between 0 and 1")
    _check_parameters(1, beta, epsilon)
    if safe_k_delta(k_max, beta, epsilon) > delta:
        raise ValueError(f"no k up to k_max={k_max} reaches this delta at this beta and epsilon")
    low, high = 1, k_max
    while low < high:
        middle = (low + high) // 2
        if safe_k_delta(middle, beta, epsilon) <= delta:
            high = middle
        else:
            low = middle + 1
    return low


# --- the mechanism's building blocks -------------------------------------------------------------


def bernoulli_sample(n: int, beta: float, rng: np.random.Generator) -> np.ndarray:
    """Keep each of ``n`` records independently with probability β: the sampling step of the theorem."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError("n must be a non-negative integer")
    _check_beta(beta)
    return rng.random(n) < beta


def safe_k_anonymise(keys: np.ndarray, k: int) -> np.ndarray:
    """Which records survive safe k-anonymisation: those whose generalised key is shared by ≥ k records.

    ``keys`` holds one row per record (or one integer code per record) of *every* released column at
    its generalisation level, chosen without looking at the data. Groups smaller than k are suppressed
    whole; there is no suppression budget, because a budget would make the output depend on the data
    in a way the theorem does not cover.
    """
    _check_k(k)
    keys = np.asarray(keys)
    if keys.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)] >= k


def exponential_mechanism_probabilities(
    scores: np.ndarray, epsilon: float, sensitivity: float, monotone: bool = False
) -> np.ndarray:
    """Selection probabilities ∝ exp(ε · score / (2 · sensitivity)) (McSherry and Talwar 2007): ε-DP.

    ``monotone=True`` drops the factor 2, ∝ exp(ε · score / sensitivity), which is ε-DP only for a
    score that moves in the same direction for every candidate when one record is added (never
    down) or removed (never up): then the normalising sum moves with the scores and the ratio of any
    candidate's probabilities on neighbouring data sets stays within e^ε (Dwork and Roth 2014, §3.4).
    The DP search's score is such a score (``kepsilon.engine.dp_quality``): adding a record never
    lowers any node's expected published quality.
    """
    _check_epsilon(epsilon)
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError("sensitivity must be a finite number above 0")
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0 or not np.isfinite(scores).all():
        raise ValueError("scores must be a non-empty array of finite numbers")
    scale = sensitivity if monotone else 2.0 * sensitivity
    weights = np.exp(epsilon * (scores - scores.max()) / scale)  # shifted: no overflow
    return weights / weights.sum()


def exponential_mechanism(
    scores: np.ndarray, epsilon: float, sensitivity: float, rng: np.random.Generator, monotone: bool = False
) -> int:
    """The index of one candidate, drawn with the exponential mechanism's probabilities."""
    probabilities = exponential_mechanism_probabilities(scores, epsilon, sensitivity, monotone)
    return int(rng.choice(probabilities.size, p=probabilities))
