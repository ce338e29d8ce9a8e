"""Re-identification risk under the standard attacker models (docs/certificate.md).

Every function here takes the sizes of equivalence classes (groups of records that share their
quasi-identifying values), or the records themselves for the special uniques, and returns figures
computed from private values: they belong in the private audit record only.

The attacker models (El Emam and Dankar 2008; ARX's definitions):

* **prosecutor** — the attacker knows their target is in the released table: a record in a group of
  ``f`` records is re-identified with probability ``1/f``.
* **journalist** — the attacker does not know whether the target is in the table and matches against
  a population: a group of ``f`` released records stands for ``F ≥ f`` people, probability ``1/F``.
  ``F`` comes from a population table, or is estimated from a sampling fraction (or sampling weights)
  by the Benedetti–Franconi individual risk, which is ``E[1/F | f]`` under its negative-binomial model.
* **marketer** — the attacker tries to re-identify everyone: the expected share of records correctly
  matched, ``Σ_j f_j · (1/F_j) / n``.

Population uniqueness (how many people are unique in the population, hence certainly found by a
journalist who knows them) is estimated from a sample's class sizes by Pitman (Hoshino 2001), Zayatz
(1991) and the slide negative binomial (Chen and Keller-McNulty 1998), chosen among by the rule of
Dankar, El Emam, Neisa and Roffey (2012). SUDA's special uniques (Elliot et al. 2002) say which
combinations of attribute values single out a record in the sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

from .errors import SpecError

# SciPy (about 0.5 s to import) is imported by the estimators that use it, not here: every `kepsilon release`
# imports this module, and one refused before ε never reaches them.

DEFAULT_THRESHOLD = 0.2  # a record counts as "at risk" above 1/5, a common threshold in health data (ARX's default view)


def _sizes(sizes) -> np.ndarray:
    array = np.asarray(sizes, dtype=np.float64)
    if array.ndim != 1 or (array.size and (array < 1).any()) or not np.isfinite(array).all():
        raise SpecError("group sizes", "must be a list of positive counts")
    return array


def group_sizes(frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """Sizes of the groups of records that share their values of ``columns`` (a missing value is a value)."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    return frame.groupby(list(columns), sort=False, dropna=False, observed=True).size().to_numpy(dtype=np.int64)


def record_risk_summary(sizes: np.ndarray, record_risk: np.ndarray, threshold: float) -> dict:
    """Highest, record-weighted average, and share of records whose risk exceeds ``threshold``."""
    n = sizes.sum()
    if n == 0:
        return {"highest": 0.0, "average": 0.0, "records_at_risk": 0.0, "threshold": threshold}
    return {
        "highest": float(record_risk.max()),
        "average": float((sizes * record_risk).sum() / n),
        "records_at_risk": float(sizes[record_risk > threshold].sum() / n),
        "threshold": threshold,
    }


def prosecutor_risk(sizes, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Prosecutor risk of groups of these sizes: highest ``1/min f``, average ``J/n``, share above threshold."""
    sizes = _sizes(sizes)
    return record_risk_summary(sizes, 1.0 / np.maximum(sizes, 1), threshold)


def prosecutor_risk_of_size_counts(size_counts: dict[int, int], threshold: float = DEFAULT_THRESHOLD) -> dict:
    """:func:`prosecutor_risk` from the frequency of frequencies (``{size: groups of that size}``, what
    :func:`size_histogram` returns and what partitions add up to) instead of one size per group."""
    sizes = np.array(sorted(size_counts), dtype=np.float64)
    groups = np.array([size_counts[int(size)] for size in sizes], dtype=np.float64)
    return record_risk_summary(sizes * groups, 1.0 / np.maximum(sizes, 1), threshold)


def add_size_counts(parts: Sequence[dict[int, int]]) -> dict[int, int]:
    """Frequencies of frequencies of disjoint sets of groups, added up, by increasing size as
    :func:`size_histogram` lists them (the estimators' float sums then run in one order)."""
    total: dict[int, int] = {}
    for part in parts:
        for size, groups in part.items():
            total[int(size)] = total.get(int(size), 0) + int(groups)
    return dict(sorted(total.items()))


def journalist_risk(sizes, population_sizes, threshold: float = DEFAULT_THRESHOLD) -> dict:
    """Journalist risk when each group's population size ``F_j`` is known (a population table).

    ``F_j`` below the sample's ``f_j`` is impossible (the sample is part of the population) and is
    raised to ``f_j``. The average is the marketer risk (:func:`marketer_risk`).
    """
    sizes = _sizes(sizes)
    population = np.maximum(_sizes(population_sizes), sizes)
    return record_risk_summary(sizes, 1.0 / population, threshold)


def marketer_risk(sizes, record_risk=None) -> float:
    """Expected share of records a marketer re-identifies: ``Σ f_j r_j / n``.

    ``record_risk`` is each group's per-record risk (``1/F_j``, or the individual risk); without it the
    table is its own population and the figure is ``J/n``.
    """
    sizes = _sizes(sizes)
    n = sizes.sum()
    if n == 0:
        return 0.0
    risk = 1.0 / sizes if record_risk is None else np.asarray(record_risk, dtype=np.float64)
    return float((sizes * risk).sum() / n)


# --- Benedetti–Franconi individual risk ---------------------------------------------------------


def individual_risk(sizes, weight_sums) -> np.ndarray:
    """sdcMicro's individual risk (Benedetti and Franconi 1998): ``E[1/F | f]`` per group.

    ``F − f`` is negative binomial with ``f`` successes of probability ``p = f / Σw`` (the group's
    records over the sum of their sampling weights, which estimates ``F``). The expectation
    ``p^f Σ_y C(f+y−1, y) (1−p)^y / (f+y)`` is computed as the integral ``p ∫₀¹ h^(f−1)/(p+(1−p)h) dh``
    (the series' generating function after the substitution ``h = pt/(1−(1−p)t)``), which stays
    accurate for large groups and small sampling fractions. ``f = 1`` gives ``p·ln(1/p)/(1−p)``;
    ``p = 1`` (no sampling) gives ``1/f``, the prosecutor risk.
    """
    sizes = _sizes(sizes)
    weights = np.asarray(weight_sums, dtype=np.float64)
    if weights.shape != sizes.shape or not np.isfinite(weights).all() or (weights <= 0).any():
        raise SpecError("weights", "need one positive, finite sum of weights per group")
    p = np.clip(sizes / weights, 0.0, 1.0)
    risk = np.empty_like(sizes)
    cache: dict[tuple[float, float], float] = {}
    for index, (f, prob) in enumerate(zip(sizes, p)):
        key = (float(f), float(prob))
        if key not in cache:
            cache[key] = _expected_inverse(*key)
        risk[index] = cache[key]
    return risk


def _expected_inverse(f: float, p: float) -> float:
    from scipy import integrate
    if p >= 1.0:
        return 1.0 / f
    q = 1.0 - p
    if f == 1:
        return p * -math.log(p) / q
    peak = max(0.0, 1.0 - 20.0 / f)  # the integrand lives within ~1/f of h = 1
    integrand = lambda h: h ** (f - 1) / (p + q * h)  # noqa: E731
    head = integrate.quad(integrand, 0.0, peak, epsabs=0, epsrel=1e-12, limit=200)[0] if peak > 0 else 0.0
    tail = integrate.quad(integrand, peak, 1.0, epsabs=0, epsrel=1e-12, limit=200)[0]
    return p * (head + tail)


# --- population uniqueness ------------------------------------------------------------------------


def size_histogram(sizes) -> dict[int, int]:
    """How many classes have each size: ``{size: number of classes}``."""
    values, counts = np.unique(_sizes(sizes).astype(np.int64), return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


def pitman_log_likelihood(theta: float, alpha: float, histogram: dict[int, int]) -> float:
    """Log-likelihood of a sample's class sizes under the Pitman sampling formula (constant dropped).

    ``Σ_{i<u} ln(θ+iα) − Σ_{i<n} ln(θ+i) + Σ_j c_j Σ_{l<j} ln(l−α)``, each sum in its gamma-function form.
    """
    return _SizeCounts.of(histogram).log_likelihood(theta, alpha)


class _SizeCounts:
    """A histogram of class sizes as arrays, for the likelihood the fit evaluates thousands of times
    (one vector of gamma functions per evaluation, not one call per size)."""

    def __init__(self, sizes: np.ndarray, counts: np.ndarray):
        self.sizes, self.counts = sizes, counts
        self.classes = float(counts.sum())
        self.records = float((sizes * counts).sum())

    @classmethod
    def of(cls, histogram: dict[int, int]) -> _SizeCounts:
        return cls(np.fromiter(histogram.keys(), dtype=np.float64, count=len(histogram)),
                   np.fromiter(histogram.values(), dtype=np.float64, count=len(histogram)))

    def log_likelihood(self, theta: float, alpha: float) -> float:
        from scipy.special import gammaln
        u, n = self.classes, self.records
        first = (u - 1) * math.log(alpha) + gammaln(theta / alpha + u) - gammaln(theta / alpha + 1)
        second = gammaln(theta + n) - gammaln(theta + 1)
        third = float(self.counts @ (gammaln(self.sizes - alpha) - gammaln(1 - alpha)))
        return float(first - second + third)


def pitman_parameters(histogram: dict[int, int]) -> tuple[float, float] | None:
    """Maximum-likelihood (θ, α) of the Pitman model, or None when the fit does not converge."""
    from scipy import optimize
    u = sum(histogram.values())
    n = sum(size * count for size, count in histogram.items())
    if u < 2 or u == n:
        return None  # all one class, or all uniques: the likelihood has no interior maximum
    sizes = _SizeCounts.of(histogram)

    def negative(x):
        return -sizes.log_likelihood(math.exp(x[0]), 1.0 / (1.0 + math.exp(-x[1])))

    best = None
    for start in ((math.log(max(u, 2.0)), 0.0), (0.0, -2.0), (math.log(n), 2.0)):
        result = optimize.minimize(negative, np.array(start), method="Nelder-Mead",
                                   options={"xatol": 1e-10, "fatol": 1e-10, "maxiter": 4000})
        if result.success and (best is None or result.fun < best.fun):
            best = result
    if best is None or not np.isfinite(best.fun):
        return None
    return math.exp(best.x[0]), 1.0 / (1.0 + math.exp(-best.x[1]))


def pitman_uniques(histogram: dict[int, int], population: float) -> float | None:
    """Population uniques under the fitted Pitman model (Hoshino 2001): ``Γ(θ+1)/Γ(θ+α) · N^α``.

    None when the fit fails or the estimate falls outside ``[0, N]``.
    """
    from scipy.special import gammaln
    if not histogram.get(1):
        return 0.0
    parameters = pitman_parameters(histogram)
    if parameters is None:
        return None
    theta, alpha = parameters
    estimate = math.exp(gammaln(theta + 1) - gammaln(theta + alpha) + alpha * math.log(population))
    return estimate if 0 <= estimate <= population else None


def zayatz_uniques(histogram: dict[int, int], sample: int, population: int) -> float | None:
    """Population uniques by Zayatz (1991).

    The share of population classes of each size is taken to be the share of sample classes of that
    size; the probability that a sample unique comes from a population unique is then
    ``(c₁/u)·P(1 | N, 1, n) / Σ_j (c_j/u)·P(1 | N, j, n)`` with ``P(1 | N, j, n)`` the hypergeometric
    probability of drawing exactly one of a class of ``j`` in ``n`` draws from ``N``. Uniques in the
    population: sample uniques × that probability ÷ the sampling fraction.
    """
    from scipy.stats import hypergeom
    uniques = histogram.get(1, 0)
    if not uniques:
        return 0.0
    u = sum(histogram.values())
    sizes = np.array(sorted(histogram), dtype=np.int64)
    shares = np.array([histogram[s] for s in sizes], dtype=np.float64) / u
    drawn_once = hypergeom.pmf(1, population, np.minimum(sizes, population), sample)
    denominator = float((shares * drawn_once).sum())
    if denominator <= 0:
        return None
    conditional = (uniques / u) * float(hypergeom.pmf(1, population, 1, sample)) / denominator
    return uniques * conditional / (sample / population)


def shlosser_classes(histogram: dict[int, int], fraction: float) -> float:
    """Shlosser's estimate of the number of non-empty classes in the population (Haas et al. 1995)."""
    u = sum(histogram.values())
    q = fraction
    numerator = sum(count * (1 - q) ** size for size, count in histogram.items())
    denominator = sum(count * size * q * (1 - q) ** (size - 1) for size, count in histogram.items())
    return u + histogram.get(1, 0) * numerator / denominator if denominator > 0 else float(u)


def snb_expected_counts(alpha: float, beta: float, classes: float, fraction: float) -> tuple[float, float]:
    """Expected sample classes of size 1 and 2 under the slide negative binomial model.

    Population class sizes are ``1 + NB(α, β)``; each member is sampled with probability π. From the
    generating function ``G(s) = s·β^α (1 − (1−β)s)^(−α)`` at ``s = 1 − π``:
    ``E c₁ = Kπ β^α (1−d)^(−α−1) (1 − d + αd)`` and
    ``E c₂ = K(π²/2) α(1−β) β^α (1−d)^(−α−2) (2 − (1−α)d)``, with ``d = (1−π)(1−β)``.
    """
    d = (1 - fraction) * (1 - beta)
    base = classes * beta ** alpha
    c1 = base * fraction * (1 - d) ** (-alpha - 1) * (1 - d + alpha * d)
    c2 = base * fraction ** 2 / 2 * alpha * (1 - beta) * (1 - d) ** (-alpha - 2) * (2 - (1 - alpha) * d)
    return c1, c2


def snb_uniques_given(c1: float, c2: float, classes: float, fraction: float) -> float | None:
    """Population uniques ``K β^α`` once α and β are solved from the observed ``c₁``, ``c₂`` and ``K``."""
    from scipy import optimize
    if c1 <= 0:
        return 0.0
    if c2 <= 0:
        return None

    def residuals(x):
        alpha, beta = math.exp(x[0]), 1.0 / (1.0 + math.exp(-x[1]))
        e1, e2 = snb_expected_counts(alpha, beta, classes, fraction)
        return [math.log(e1 / c1), math.log(e2 / c2)]

    best = None
    for start in ((0.0, 0.0), (-2.0, -2.0), (2.0, 2.0), (-1.0, 3.0)):
        try:
            result = optimize.least_squares(residuals, np.array(start), xtol=1e-14, ftol=1e-14, gtol=1e-14)
        except (ValueError, OverflowError, ZeroDivisionError):
            continue
        if best is None or result.cost < best.cost:
            best = result
    if best is None or best.cost > 1e-10:
        return None
    alpha, beta = math.exp(best.x[0]), 1.0 / (1.0 + math.exp(-best.x[1]))
    return classes * beta ** alpha


def snb_uniques(histogram: dict[int, int], fraction: float) -> float | None:
    """Population uniques by the slide negative binomial model, with Shlosser's estimate of K."""
    if not histogram.get(1):
        return 0.0
    classes = shlosser_classes(histogram, fraction)
    return snb_uniques_given(histogram.get(1, 0), histogram.get(2, 0), classes, fraction)


def population_uniqueness(sizes, population: int) -> dict:
    """Population uniques by each model and by Dankar et al.'s rule, as counts and as shares of N.

    Dankar et al. (2012): with a sampling fraction of at most 10 %, Pitman (Zayatz when Pitman does not
    converge); above, the smaller of Zayatz and SNB (Zayatz when SNB does not converge).
    """
    sizes = _sizes(sizes)
    return population_uniqueness_of_size_counts(size_histogram(sizes) if sizes.sum() else {}, population)


def population_uniqueness_of_size_counts(histogram: dict[int, int], population: int) -> dict:
    """:func:`population_uniqueness` from the frequency of frequencies (``{size: groups}``): every
    estimator here needs only that, so partitions can count their groups' sizes and add them up."""
    sample = int(sum(size * count for size, count in histogram.items()))
    if population < sample:
        raise SpecError("population.size", "must be at least the number of records")
    fraction = sample / population if population else 1.0
    estimates: dict[str, float | None]
    value: float | None
    if not histogram.get(1):
        estimates = {"pitman": 0.0, "zayatz": 0.0, "snb": 0.0}
        chosen = "none (no sample uniques)"
        value = 0.0
    else:
        estimates = {
            "pitman": pitman_uniques(histogram, population),
            "zayatz": zayatz_uniques(histogram, sample, population),
            "snb": snb_uniques(histogram, fraction),
        }
        chosen, value = dankar_choice(estimates, fraction)
    return {
        "sampling_fraction": fraction,
        "sample_uniques": int(histogram.get(1, 0)),
        "estimates": estimates,
        "model": chosen,
        "population_uniques": value,
        "population_uniqueness": (value / population) if value is not None and population else None,
    }


def dankar_choice(estimates: dict[str, float | None], fraction: float) -> tuple[str, float | None]:
    """The model Dankar et al.'s rule picks and its estimate (None when no model gives one)."""
    pitman, zayatz, snb = estimates.get("pitman"), estimates.get("zayatz"), estimates.get("snb")
    if fraction <= 0.1:
        return ("pitman", pitman) if _valid(pitman) else ("zayatz", zayatz)
    if snb is not None and zayatz is not None and _valid(snb) and _valid(zayatz):
        return ("zayatz", zayatz) if zayatz < snb else ("snb", snb)
    return ("zayatz", zayatz) if _valid(zayatz) else ("snb", snb)


def _valid(value) -> bool:
    return value is not None and np.isfinite(value) and value > 0


# --- SUDA special uniques ---------------------------------------------------------------------


def minimal_sample_uniques(
    frame: pd.DataFrame, columns: Sequence[str], max_size: int, weights: np.ndarray | None = None
) -> dict[tuple[str, ...], np.ndarray]:
    """Per combination of up to ``max_size`` columns, which records it singles out minimally.

    A record's values on a set of columns are a *minimal sample unique* (MSU) when no other record
    shares them and no proper subset of them is unique already (SUDA's definition). Uniqueness only
    grows with the set, so a set is minimal exactly when none of its subsets one column smaller is
    unique: the search walks the sizes upwards, keeping the previous size's uniqueness per record.
    Returns ``{columns: boolean mask of the records for which it is an MSU}`` for non-empty masks.

    With ``weights`` the rows are distinct tuples standing for that many records each (a histogram,
    as the Dask engine holds the source): a tuple is unique on a set of columns when the records of
    every tuple that agrees with it there add up to one, so only tuples of weight 1 can be flagged.
    """
    columns = list(columns)
    codes = {c: pd.factorize(frame[c], use_na_sentinel=False)[0].astype(np.int64) for c in columns}
    n = len(frame)
    return minimal_sample_uniques_given(columns, max_size, lambda combo: _unique_rows([codes[c] for c in combo], n, weights))


def suda_combinations(columns: Sequence[str], max_size: int) -> list[tuple[str, ...]]:
    """The column combinations SUDA searches, smallest first (the order its figures list them in)."""
    if max_size < 1:
        raise SpecError("suda_max_size", "must be at least 1")
    columns = list(columns)
    return [combo for size in range(1, min(max_size, len(columns)) + 1) for combo in combinations(columns, size)]


def minimal_sample_uniques_given(
    columns: Sequence[str], max_size: int, unique_on
) -> dict[tuple[str, ...], np.ndarray]:
    """:func:`minimal_sample_uniques` with uniqueness told by ``unique_on(combination)`` (per row: whether
    the records sharing its values there are one). A partition of a histogram can answer that from
    counts added up over every partition (``tasks/certificate_dask.py``), then find its own MSUs."""
    searched = suda_combinations(columns, max_size)  # refuses a max_size below 1
    unique_at: dict[tuple[str, ...], np.ndarray] = {}
    found: dict[tuple[str, ...], np.ndarray] = {}
    for size in range(1, min(max_size, len(columns)) + 1):
        current: dict[tuple[str, ...], np.ndarray] = {}
        for combo in [c for c in searched if len(c) == size]:
            unique = np.asarray(unique_on(combo), dtype=bool)
            current[combo] = unique
            minimal = unique.copy()
            if size > 1:
                for drop in range(size):
                    minimal &= ~unique_at[combo[:drop] + combo[drop + 1:]]
            if minimal.any():
                found[combo] = minimal
        unique_at = current
    return found


def _unique_rows(code_arrays: list[np.ndarray], n: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Per row: whether the records sharing its codes on these columns are one (itself)."""
    if n == 0:
        return np.zeros(0, dtype=bool)
    key = np.zeros(n, dtype=np.int64)
    for codes in code_arrays:
        key = key * (int(codes.max()) + 1) + codes
        key = pd.factorize(key)[0].astype(np.int64)  # keep the combined code small
    counts = np.bincount(key, weights=weights)
    return counts[key] == 1


def suda_scores(msus: dict[tuple[str, ...], np.ndarray], n_records: int, n_columns: int, max_size: int) -> np.ndarray:
    """Per record, the SUDA score: each MSU of size k adds ``Π_{i=k}^{M−1} (A − i)``.

    ``A`` is the number of key columns and ``M`` the largest MSU size searched, so a smaller MSU (fewer
    values needed to single a person out) weighs more (Elliot et al. 2002). Implementations that
    multiply every term by ``A − M`` as well give proportional scores: the ranking is the same.
    """
    scores = np.zeros(n_records, dtype=np.float64)
    top = min(max_size, n_columns)
    for combo, mask in msus.items():
        weight = math.prod(n_columns - i for i in range(len(combo), top))
        scores[mask] += weight
    return scores


def special_uniques(frame: pd.DataFrame, columns: Sequence[str], max_size: int = 3, top: int = 10,
                    weights: np.ndarray | None = None) -> dict:
    """SUDA's warning on a table: which column combinations single people out, and how many people.

    Counts only, never a value: per combination the number of records it singles out minimally; the
    records with at least one MSU; the distribution of SUDA scores. With ``weights``, ``frame`` holds
    distinct tuples standing for that many records each (see :func:`minimal_sample_uniques`); every
    figure is then the one the records themselves would give.
    """
    msus = minimal_sample_uniques(frame, columns, max_size, weights)
    part = special_uniques_part(msus, len(frame), columns, max_size, weights)
    return special_uniques_of_parts([part], columns, max_size, top)


def special_uniques_part(msus: dict[tuple[str, ...], np.ndarray], rows: int, columns: Sequence[str], max_size: int,
                         weights: np.ndarray | None = None) -> dict:
    """What :func:`special_uniques` adds up over rows, for some of them (a shard of a histogram): records,
    records per MSU combination, records with an MSU, the largest score and the record-weighted score sum."""
    scores = suda_scores(msus, rows, len(columns), max_size)
    per_row = np.ones(rows) if weights is None else np.asarray(weights, dtype=np.float64)
    return {
        "records": float(per_row.sum()),
        "by_combo": {combo: float(per_row[mask].sum()) for combo, mask in msus.items()},
        "records_with_msu": float(per_row[scores > 0].sum()),
        "score_max": float(scores.max()) if len(scores) else 0.0,
        "score_sum": float((scores * per_row).sum()),
    }


def special_uniques_of_parts(parts: Sequence[dict], columns: Sequence[str], max_size: int, top: int = 10) -> dict:
    """:func:`special_uniques`' figures from its parts (:func:`special_uniques_part`) of disjoint rows.

    Record counts and score sums are integers held as floats (exact below 2^53), so the figures do
    not depend on how the rows were split."""
    records = int(round(sum(part["records"] for part in parts)))
    totals: dict[tuple[str, ...], float] = {}
    for combo in suda_combinations(columns, max_size):  # the search's order: ties listed as one table lists them
        found = [part["by_combo"][combo] for part in parts if combo in part["by_combo"]]
        if found:
            totals[combo] = sum(found)
    by_combo = sorted(((list(combo), int(round(count))) for combo, count in totals.items()),
                      key=lambda item: (-item[1], len(item[0])))
    by_size: dict[str, int] = {}
    for combo, total in totals.items():  # by size, smallest first, as the search finds them
        by_size[str(len(combo))] = by_size.get(str(len(combo)), 0) + int(round(total))
    return {
        "columns": list(columns),
        "max_size": max_size,
        "records": records,
        "records_with_msu": int(round(sum(part["records_with_msu"] for part in parts))),
        "msus_by_size": by_size,
        "combinations": [{"columns": combo, "records": count} for combo, count in by_combo[:top]],
        "combinations_total": len(by_combo),
        "score_max": max((part["score_max"] for part in parts), default=0.0),
        "score_mean": float(sum(part["score_sum"] for part in parts) / records) if records else 0.0,
    }


# --- a population table -----------------------------------------------------------------------


def population_group_sizes(group_labels: pd.DataFrame, population: pd.DataFrame, hierarchies: dict, counts: str = "count") -> np.ndarray:
    """Per published group, how many people of the population it could be: ``F_j`` for the journalist.

    ``group_labels`` has one row per group and one column per k-quasi, holding the group's label (a node
    of the column's hierarchy); ``population`` holds the k-quasi columns as values of the source (leaves
    of the hierarchies) and a ``counts`` column. A person is consistent with a group when, in every
    column, the group's label is their value or one of its generalisations; groups may overlap (a
    person consistent with two groups counts in both), which is what an attacker matching them sees.
    """
    columns = list(group_labels.columns)
    weights = pd.to_numeric(population[counts], errors="coerce").to_numpy(dtype=np.float64)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise SpecError("population.table", f"column {counts!r} must hold non-negative counts")
    covered = {}  # column -> per group: boolean over population rows
    for column in columns:
        hierarchy = hierarchies[column]
        leaf_codes = hierarchy.leaf_codes(population[column])
        # Per label text, the leaves it covers at any level.
        label_cover: dict[str, np.ndarray] = {}
        for level in range(hierarchy.height):
            for label in np.unique(hierarchy.labels[level].astype(str)):
                leaves = hierarchy.labels[level].astype(str) == label
                label_cover[label] = label_cover.get(label, np.zeros(len(hierarchy.leaves), dtype=bool)) | leaves
        covered[column] = {label: cover[leaf_codes] for label, cover in label_cover.items()}
    sizes = np.zeros(len(group_labels), dtype=np.float64)
    empty = np.zeros(len(population), dtype=bool)
    for index, row in enumerate(group_labels.astype(str).itertuples(index=False)):
        mask = np.ones(len(population), dtype=bool)
        for column, label in zip(columns, row):
            mask &= covered[column].get(label, empty)
        sizes[index] = weights[mask].sum()
    return sizes
