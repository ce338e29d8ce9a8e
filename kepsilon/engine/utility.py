"""Is the released table still fit for its purpose? The certificate's utility report (docs/certificate.md).

Per released column, the distance between the source's distribution and the release's; the
ε-quasis' correlations before and after the noise; the generalisation measures ARX reports
(granularity, non-uniform entropy, discernibility); and a classifier utility as ARX reports it: a model
trained on the released records and one trained on the source, both scored on held-out source records.

Every figure is computed from private values: it belongs in the private audit record only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .errors import SpecError

# SciPy is imported by the two distances that use it, not here (see risk.py: a refused release never needs it).

MAX_TRAINING_ROWS = 3_000  # the classifier utility trains on at most this many records, and scores at most
MAX_TEST_ROWS = 3_000  # this many: its cost must not dominate a release (docs/certificate.md)
MAX_LEVELS = 50  # one-hot encoding keeps a column's 50 most frequent values; the rest share one indicator


def total_variation(source: pd.Series, released: pd.Series) -> float:
    """Total variation distance ``½ Σ_v |p(v) − q(v)|`` between two categorical distributions (values as text)."""
    p = source.astype("string").fillna("\x00missing").value_counts(normalize=True)
    q = released.astype("string").fillna("\x00missing").value_counts(normalize=True)
    both = p.index.union(q.index)
    return float(0.5 * np.abs(p.reindex(both, fill_value=0.0) - q.reindex(both, fill_value=0.0)).sum())


def total_variation_from_counts(source: pd.Series, released: pd.Series) -> float:
    """:func:`total_variation` from value counts (value → records), as partitions add them up."""
    p = source / source.sum() if source.sum() else source
    q = released / released.sum() if released.sum() else released
    both = p.index.union(q.index)
    return float(0.5 * np.abs(p.reindex(both, fill_value=0.0) - q.reindex(both, fill_value=0.0)).sum())


def numeric_distances(source, released, grid: float | None = None, span: float | None = None) -> dict:
    """Wasserstein-1 and Kolmogorov–Smirnov distances between a numeric column before and after.

    With ``grid`` the source values are snapped to the published grid first, so that the grid's own
    rounding is not counted as a change. ``span`` (the public bounds' width) scales the Wasserstein
    distance to a share of the column's range.
    """
    from scipy import stats
    source = np.asarray(source, dtype=np.float64)
    released = np.asarray(released, dtype=np.float64)
    source = source[np.isfinite(source)]
    released = released[np.isfinite(released)]
    if not len(source) or not len(released):
        return {"wasserstein": None, "wasserstein_of_range": None, "ks": None}
    if grid:
        source = np.round(source / grid) * grid
    wasserstein = float(stats.wasserstein_distance(source, released))
    return {
        "wasserstein": wasserstein,
        "wasserstein_of_range": wasserstein / span if span else None,
        "ks": float(stats.ks_2samp(source, released).statistic),
    }


def numeric_distances_from_counts(source: pd.Series, released: pd.Series, span: float | None = None) -> dict:
    """:func:`numeric_distances` from value counts (value → records), as partitions add them up.

    ``source`` holds the source's values already snapped to the published grid; both are exact
    distributions, so Wasserstein-1 (weighted) and the Kolmogorov–Smirnov statistic (largest gap
    between the two cumulative distributions over the union of their values) are the ones the
    records themselves give.
    """
    from scipy import stats
    source = source[np.isfinite(source.index.to_numpy(dtype=np.float64)) & (source.to_numpy() > 0)]
    released = released[np.isfinite(released.index.to_numpy(dtype=np.float64)) & (released.to_numpy() > 0)]
    if not len(source) or not len(released):
        return {"wasserstein": None, "wasserstein_of_range": None, "ks": None}
    u, uw = source.index.to_numpy(dtype=np.float64), source.to_numpy(dtype=np.float64)
    v, vw = released.index.to_numpy(dtype=np.float64), released.to_numpy(dtype=np.float64)
    wasserstein = float(stats.wasserstein_distance(u, v, uw, vw))
    support = np.union1d(u, v)
    cdf_u = np.cumsum(pd.Series(uw, index=u).groupby(level=0).sum().reindex(support, fill_value=0.0).to_numpy()) / uw.sum()
    cdf_v = np.cumsum(pd.Series(vw, index=v).groupby(level=0).sum().reindex(support, fill_value=0.0).to_numpy()) / vw.sum()
    return {
        "wasserstein": wasserstein,
        "wasserstein_of_range": wasserstein / span if span else None,
        "ks": float(np.abs(cdf_u - cdf_v).max()),
    }


def moments(frame: pd.DataFrame, columns: Sequence[str]) -> dict:
    """The sums Pearson correlations need (records, Σx, Σxxᵀ over rows with every column finite), to add up."""
    values = frame[list(columns)].to_numpy(dtype=np.float64)
    values = values[np.isfinite(values).all(axis=1)]
    return {"n": int(len(values)), "sum": values.sum(axis=0), "cross": values.T @ values}


def add_moments(parts: list[dict]) -> dict:
    """Moments of the union of the parts' rows."""
    return {"n": sum(p["n"] for p in parts), "sum": sum(p["sum"] for p in parts), "cross": sum(p["cross"] for p in parts)}


def correlations_from_moments(columns: Sequence[str], before: dict, after: dict) -> dict | None:
    """:func:`correlation_change` from the source's and the release's :func:`moments`."""
    columns = list(columns)
    if len(columns) < 2:
        return None

    def matrix(m: dict) -> np.ndarray:
        if m["n"] < 2:
            return np.full((len(columns), len(columns)), np.nan)
        mean = m["sum"] / m["n"]
        covariance = m["cross"] / m["n"] - np.outer(mean, mean)
        scale = np.sqrt(np.clip(np.diag(covariance), 0, None))
        with np.errstate(divide="ignore", invalid="ignore"):
            return covariance / np.outer(scale, scale)

    first, second = matrix(before), matrix(after)
    pairs: list[dict[str, Any]] = [
        {"columns": [columns[i], columns[j]], "before": _finite(first[i, j]), "after": _finite(second[i, j])}
        for i in range(len(columns)) for j in range(i + 1, len(columns))
    ]
    changes = [abs(p["after"] - p["before"]) for p in pairs if p["before"] is not None and p["after"] is not None]
    return {"pairs": pairs, "largest_change": max(changes) if changes else None}


def correlation_change(source: pd.DataFrame, released: pd.DataFrame, columns: Sequence[str]) -> dict | None:
    """Pearson correlations between the ε-quasis before and after the noise, and the largest change."""
    columns = list(columns)
    if len(columns) < 2:
        return None
    before = source[columns].astype(np.float64).corr()
    after = released[columns].astype(np.float64).corr()
    pairs: list[dict[str, Any]] = []
    for i, first in enumerate(columns):
        for second in columns[i + 1:]:
            pairs.append({"columns": [first, second], "before": _finite(before.loc[first, second]),
                          "after": _finite(after.loc[first, second])})
    changes = [abs(p["after"] - p["before"]) for p in pairs if p["before"] is not None and p["after"] is not None]
    return {"pairs": pairs, "largest_change": max(changes) if changes else None}


def _finite(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


# --- generalisation measures --------------------------------------------------------------------


def granularity(source_values: pd.Series, released_labels: pd.Series, hierarchy) -> float:
    """ARX's granularity of one k-quasi: ``1 − mean over records of (leaves covered − 1)/(leaves − 1)``.

    A label covers the hierarchy's leaves whose generalisation it is; a value released as it is covers
    one (granularity 1), the top label covers all (granularity 0). ``source_values`` and
    ``released_labels`` are aligned record by record.
    """
    leaves = len(hierarchy.leaves)
    if leaves <= 1:
        return 1.0
    covered = _leaves_covered(hierarchy, hierarchy.leaf_codes(source_values), released_labels.astype(str).to_numpy())
    return float(1.0 - np.mean((covered - 1.0) / (leaves - 1.0)))


def _leaves_covered(hierarchy, leaf_codes: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """How many of the hierarchy's leaves each released label covers, given the source value's leaf code:
    the size of the label at the level where it is the value's generalisation, 1 where it is the value itself."""
    covered = np.ones(len(labels), dtype=np.float64)
    for level in range(hierarchy.height):
        level_labels = hierarchy.labels[level].astype(str)
        match = level_labels[leaf_codes] == labels
        if match.any():
            sizes = pd.Series(level_labels).value_counts()
            covered = np.where(match, sizes.reindex(labels).to_numpy(dtype=np.float64), covered)
    return covered


def non_uniform_entropy(source_values: pd.Series, released_labels: pd.Series) -> float:
    """Non-uniform entropy (Gionis and Tassa 2009, as ARX reports it), in bits per record.

    ``Σ_records −log₂ P(value | label)``, with ``P`` the share of the source's records released under
    that label that hold that value; 0 when nothing is generalised. Averaged over records.
    """
    frame = pd.DataFrame({"value": source_values.astype("string").to_numpy(), "label": released_labels.astype(str).to_numpy()})
    if not len(frame):
        return 0.0
    pair = frame.groupby(["label", "value"], dropna=False, sort=False)["value"].transform("size")
    label = frame.groupby("label", dropna=False, sort=False)["label"].transform("size")
    return float(np.mean(-np.log2(pair.to_numpy(dtype=np.float64) / label.to_numpy(dtype=np.float64))))


def generalisation_from_pairs(pairs: pd.DataFrame, hierarchy) -> dict:
    """Granularity, non-uniform entropy and the share released as read, from (value, label, records) counts.

    The same figures as :func:`granularity` and :func:`non_uniform_entropy` on the records those
    counts stand for (``value``: the source's value as text; ``label``: the published label); what
    the partitions of a Dask release add up.
    """
    records = pairs["records"].to_numpy(dtype=np.float64)
    total = records.sum()
    if not total:
        return {"granularity": 1.0, "non_uniform_entropy_bits": 0.0, "released_as_read": None}
    values = pairs["value"].astype(str).to_numpy()
    labels = pairs["label"].astype(str).to_numpy()
    leaves = len(hierarchy.leaves)
    covered = np.ones(len(pairs), dtype=np.float64)
    if leaves > 1:
        covered = _leaves_covered(hierarchy, hierarchy.leaf_codes(pairs["value"].reset_index(drop=True)), labels)
    granular = 1.0 - float((records * (covered - 1.0)).sum() / total / (leaves - 1.0)) if leaves > 1 else 1.0
    per_label = pd.Series(records).groupby(labels).transform("sum").to_numpy(dtype=np.float64)
    entropy = float((records * -np.log2(records / per_label)).sum() / total)
    return {"granularity": granular, "non_uniform_entropy_bits": entropy,
            "released_as_read": float(records[values == labels].sum() / total)}


def discernibility(group_sizes, suppressed: int, total: int) -> float:
    """Discernibility metric (Bayardo and Agrawal 2005): ``Σ f_j² + suppressed · n``, and per record."""
    sizes = np.asarray(group_sizes, dtype=np.float64)
    return float((sizes**2).sum() + suppressed * total)


# --- classifier utility ---------------------------------------------------------------------------


def classifier_utility(
    source: pd.DataFrame, released: pd.DataFrame, target: str, numeric: Sequence[str], seed: int = 0, test_share: float = 0.2
) -> dict:
    """Accuracy of a classifier trained on the released records vs one trained on the source (ARX's view).

    ``source`` and ``released`` hold the same records, aligned row by row (the released values of
    each source record). The records are split once (``test_share`` held out, seeded; at most ``MAX_TRAINING_ROWS`` trained on and
    ``MAX_TEST_ROWS`` scored); the target is the
    source's value in both, so both models answer the same question about the held-out people. The
    released model sees the held-out records as they were released (a reader's view of them). A numeric
    target is cut at the source's quartiles. Reports, per model kind, both accuracies, the majority
    baseline, and the relative utility ``(released − baseline)/(source − baseline)``.
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    if target not in source.columns or target not in released.columns:
        raise SpecError("certificate.utility_target", "is not a released column")
    if len(source) != len(released):
        raise SpecError("released", "must hold the source's records, aligned")
    labels = _class_labels(source[target], target in numeric)
    features = [c for c in released.columns if c != target]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(source))
    n_test = max(1, int(round(len(source) * test_share)))
    test, train = order[:n_test][:MAX_TEST_ROWS], order[n_test:][:MAX_TRAINING_ROWS]
    if len(train) < 10 or labels.iloc[train].nunique() < 2:
        return {"target": target, "computed": False, "reason": "too few records or a single class to train on"}

    def encoder(frame: pd.DataFrame) -> ColumnTransformer:
        numbers = [c for c in features if c in numeric and pd.api.types.is_numeric_dtype(frame[c])]
        texts = [c for c in features if c not in numbers]
        return ColumnTransformer(
            [("numbers", StandardScaler(), numbers),
             ("texts", OneHotEncoder(handle_unknown="infrequent_if_exist", max_categories=MAX_LEVELS), texts)]
        )

    def prepare(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame[features].copy()
        for column in features:
            if column in numeric and pd.api.types.is_numeric_dtype(out[column]):
                out[column] = out[column].astype(np.float64).fillna(0.0)
            else:
                out[column] = out[column].astype("string").fillna("").astype(object)
        return out

    source_x, released_x = prepare(source), prepare(released)
    truth = labels.iloc[test].to_numpy()
    baseline = float((truth == labels.iloc[train].mode().iloc[0]).mean())
    models = {
        "logistic_regression": lambda: LogisticRegression(max_iter=300),
        "random_forest": lambda: RandomForestClassifier(n_estimators=25, max_depth=10, random_state=seed, n_jobs=1),
    }
    results = {}
    for name, make in models.items():
        accuracies = {}
        for kind, x in (("source", source_x), ("released", released_x)):
            model = make_pipeline(encoder(x), make())
            model.fit(x.iloc[train], labels.iloc[train].to_numpy())
            accuracies[kind] = float((model.predict(x.iloc[test]) == truth).mean())
        gain = accuracies["source"] - baseline
        results[name] = {
            **accuracies,
            "relative": (accuracies["released"] - baseline) / gain if gain > 1e-12 else None,
        }
    return {"target": target, "computed": True, "baseline": baseline, "test_records": int(len(test)),
            "training_records": int(len(train)), "models": results}


def _class_labels(values: pd.Series, numeric: bool) -> pd.Series:
    if numeric and pd.api.types.is_numeric_dtype(values):
        quartiles = np.unique(np.nanquantile(values.astype(np.float64), [0.25, 0.5, 0.75]))
        return pd.Series(np.searchsorted(quartiles, values.astype(np.float64), side="right"), index=values.index).astype(str)
    return values.astype("string").fillna("").astype(str)
