"""Information loss and disclosure risk of a (k,ε)-anonymised release (method.md §6).

All functions take per-row arrays plus per-row class ids (non-negative integers, not necessarily
dense) and are vectorised: one sort per call, nothing quadratic per class.

Relative errors divide by ``|v|``: a zero original value has no relative error. Both error functions
therefore **refuse** (``InputError``) a column holding zeros rather than silently dropping records,
which would bias the figure; shift or rescale such a column before using relative error.

The release's predicted error (:func:`e_quasi_metrics`) is computed from the scales the perturbation
actually drew with, not from re-derived diameters: a class holding a zero has that zero in its
diameter even though the zero's own relative error is undefined, and both scale bases clamp inputs and
outputs to the public bounds. See :func:`expected_absolute_error` for the exact expectation. Every figure here is computed
from private values and belongs in the private audit record only (method.md §9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .errors import InputError, SpecError
from .perturb import class_diameters, dense_class_ids, grid_bounds, noise_scales, public_grid
from .suppress import ClassSortedValues

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine


def _values(name: str, values, n_rows: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or (n_rows is not None and len(array) != n_rows):
        raise SpecError(name, "needs one value per row" + (f" ({n_rows})" if n_rows is not None else ""))
    if not np.isfinite(array).all():
        raise SpecError(name, "holds missing or infinite values")
    return array


def _refuse_zeros(values: np.ndarray, column: str | None) -> None:
    zeros = int((values == 0).sum())
    if zeros:
        raise InputError(column, f"relative error is undefined for {zeros} zero value(s)")


def measured_relative_error(original, noisy, column: str | None = None) -> float:
    """Mean over records of ``|v' − v| / |v|``; refuses zero originals (see module docstring).

    ``column`` only names the column in error messages.
    """
    original = _values("original", original)
    noisy = _values("noisy", noisy, len(original))
    if not len(original):
        return 0.0
    _refuse_zeros(original, column)
    return float(np.mean(np.abs(noisy - original) / np.abs(original)))


def predicted_relative_error(original, class_ids, epsilon: float, column: str | None = None) -> float:
    """Expected relative error before any noise is drawn, diameter basis (method.md §4).

    ``err = (1/ε)·Σ_ec (diam(ec)/H(ec))·|ec|/n`` with ``H`` the harmonic mean of ``|v|`` in the class.
    Since ``|ec|/H(ec) = Σ_{i∈ec} 1/|v_i|``, this is the mean over records of ``diam(ec_i)/(ε·|v_i|)``,
    which is how it is computed. ``epsilon`` is the column's share of the record's ε.

    This is the paper's formula on the values as given; the release's figure is
    :func:`e_quasi_metrics`, which uses the scales the noise was drawn with and the clamps.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating)) or not (
        math.isfinite(epsilon) and epsilon > 0
    ):
        raise SpecError("epsilon", "must be positive and finite")
    original = _values("original", original)
    dense_ids, n_classes = dense_class_ids(class_ids, len(original))
    if not len(original):
        return 0.0
    _refuse_zeros(original, column)
    diameters = class_diameters(original, dense_ids, n_classes)
    return float(np.mean(diameters[dense_ids] / np.abs(original)) / epsilon)


def linked_records(original, noisy, class_ids) -> np.ndarray:
    """Per row: whether its noisy value is nearest to its own original among its class's originals.

    Linked when ``|v'_i − v_i| = min_j |v'_i − v_j|`` over j in the class (ties count as linked, as in
    the paper). The nearest original is found by one ``searchsorted`` of the noisy value in the
    class-sorted originals: it is the predecessor or the successor.
    """
    original = _values("original", original)
    noisy = _values("noisy", noisy, len(original))
    dense_ids, _ = dense_class_ids(class_ids, len(original))
    if not len(original):
        return np.zeros(0, dtype=bool)
    index = ClassSortedValues(dense_ids, original)
    sorted_values, sorted_classes = index.sorted_values()
    successor = index.position(dense_ids, noisy, inclusive=False)
    predecessor = successor - 1
    n = len(original)
    nearest = np.full(n, np.inf)
    for candidate in (predecessor, successor):
        valid = (candidate >= 0) & (candidate < n)
        position = np.clip(candidate, 0, n - 1)
        valid &= sorted_classes[position] == dense_ids
        distance = np.where(valid, np.abs(noisy - sorted_values[position]), np.inf)
        nearest = np.minimum(nearest, distance)
    return np.abs(noisy - original) <= nearest


def linking_risk(original, noisy, class_ids) -> float:
    """Fraction of records linked to themselves by nearest neighbour (method.md §6); 0 if empty."""
    linked = linked_records(original, noisy, class_ids)
    return float(linked.mean()) if len(linked) else 0.0


def certain_linking_risk(frame: pd.DataFrame, class_ids, spec: ReleaseSpec) -> float:
    """A lower bound of the linking risk known before any noise: the largest share, over ε-quasis, of the
    kept records whose class has zero diameter in that column (diameter basis only; 0 otherwise).

    Such a class gets no noise (b = 0), its records keep their values, survive confidence suppression
    (each value matches its whole class) and link to themselves. Published records are at most the kept
    ones, so the share can only grow. The flow refuses a release whose bound already exceeds
    ``max_linking_risk`` before reserving ε ("refuse before you spend").
    """
    if spec.scale_basis != "diameter" or not len(frame):
        return 0.0
    dense_ids, n_classes = dense_class_ids(class_ids, len(frame))
    shares = []
    for quasi in spec.roles.e_quasi:
        values = np.clip(frame[quasi.column].to_numpy(dtype=np.float64), quasi.lower, quasi.upper)
        zero = class_diameters(values, dense_ids, n_classes) == 0
        shares.append(float(zero[dense_ids].mean()))
    return max(shares, default=0.0)


def class_statistics(class_ids, n_suppressed: int) -> dict[str, Any]:
    """Class counts and sizes, discernibility and prosecutor risk of the kept rows.

    ``class_ids``: one id per kept row. ``n_suppressed``: rows removed at any stage, each charged
    ``n_total`` in the discernibility (``Σ|ec|² + n_suppressed·n_total``, ``n_total`` = kept +
    suppressed). Prosecutor risk of a record is ``1/|ec|``; mean and max are over kept records.
    """
    if isinstance(n_suppressed, bool) or not isinstance(n_suppressed, (int, np.integer)) or n_suppressed < 0:
        raise SpecError("n_suppressed", "must be a non-negative integer")
    class_ids = np.asarray(class_ids)
    dense_ids, n_classes = dense_class_ids(class_ids, len(class_ids))
    return class_statistics_from_sizes(np.bincount(dense_ids, minlength=n_classes), n_suppressed)


def class_statistics_from_sizes(sizes, n_suppressed: int) -> dict[str, Any]:
    """:func:`class_statistics` from the kept records per class (classes of size 0 left out)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    values, counts = np.unique(sizes[sizes > 0], return_counts=True)
    return class_statistics_from_size_counts(values, counts, n_suppressed)


def class_statistics_from_size_counts(values, counts, n_suppressed: int) -> dict[str, Any]:
    """:func:`class_statistics` from a frequency of frequencies of the kept records per class: ``counts[i]``
    classes of ``values[i]`` records (values > 0, increasing), which a partitioned release adds up over its
    partitions without gathering a row per class. Exactly the figures of the classes' sizes themselves: the
    sums are integers, and the mean is their quotient (what ``numpy.mean`` of integer sizes gives)."""
    values = [int(v) for v in np.asarray(values, dtype=np.int64)]
    counts = [int(c) for c in np.asarray(counts, dtype=np.int64)]
    n_classes = sum(counts)
    n_kept = sum(v * c for v, c in zip(values, counts))
    n_total = n_kept + int(n_suppressed)
    return {
        "n_classes": int(n_classes),
        "records_kept": n_kept,
        "records_suppressed": int(n_suppressed),
        "smallest_class": min(values) if n_classes else 0,
        "largest_class": max(values) if n_classes else 0,
        "mean_class_size": float(n_kept / n_classes) if n_classes else 0.0,
        "discernibility": sum(v * v * c for v, c in zip(values, counts)) + int(n_suppressed) * n_total,
        "prosecutor_risk_mean": float(n_classes / n_kept) if n_kept else 0.0,
        "prosecutor_risk_max": float(1.0 / min(values)) if n_classes else 0.0,
    }


def expected_absolute_error(original, centre, scales, low: float = -math.inf, high: float = math.inf) -> np.ndarray:
    """Per row, ``E|Y − v|`` for ``Y = clamp(c + X, low, high)``, ``X ~ Laplace(0, b)``, exactly.

    ``original``: ``v``; ``centre``: ``c``, the value the noise was added to (``v`` clamped to the
    public bounds); ``scales``: ``b`` per row (0: no noise, ``Y = clamp(c, low, high)``); ``low``,
    ``high``: the output clamp (the release's: the bounds rounded inwards to the grid, ``L'`` and
    ``U'``, in both scale bases; infinite for an unclamped Laplace). With ``S(t) = P(c + X > t)``,

        E|Y − v| = ∫_v^∞ P(Y > t) dt + ∫_−∞^v P(Y ≤ t) dt
                 = (lo − v)⁺ + ∫_{max(v,lo)}^{hi} S + (v − hi)⁺ + ∫_{lo}^{min(v,hi)} (1 − S),

    in closed form through the antiderivatives ``A(t) = min(t − c, 0) − (b/2)e^{−|t−c|/b}`` of ``S``
    and ``B(t) = max(t − c, 0) + (b/2)e^{−|t−c|/b}`` of ``1 − S`` (``A(∞) = B(−∞) = 0``). Special
    cases: ``b`` when ``v = c`` and there is no clamp; ``|v − c| + (b/2)(2 − e^{−(hi−c)/b} −
    e^{−(c−lo)/b})`` when ``lo ≤ c ≤ hi`` and ``v`` lies beyond ``c`` on the clamped side.
    The rounding to the public grid (at most half a grid step per value, and symmetric) is not
    modelled.
    """
    v = np.asarray(original, dtype=np.float64)
    c = np.asarray(centre, dtype=np.float64)
    b = np.asarray(scales, dtype=np.float64)
    noised = b > 0
    safe_b = np.where(noised, b, 1.0)

    def tail(t):
        with np.errstate(invalid="ignore"):
            return np.where(np.isinf(t), 0.0, 0.5 * safe_b * np.exp(-np.abs(t - c) / safe_b))

    def antiderivative_above(t):  # A
        return np.where(np.isinf(t), 0.0, np.minimum(t - c, 0.0)) - tail(t)

    def antiderivative_below(t):  # B
        return np.where(np.isinf(t), 0.0, np.maximum(t - c, 0.0)) + tail(t)

    lo = np.full_like(v, low)
    hi = np.full_like(v, high)
    start = np.maximum(v, lo)
    above = np.maximum(lo - v, 0.0) + np.where(start < hi, antiderivative_above(hi) - antiderivative_above(start), 0.0)
    end = np.minimum(v, hi)
    below = np.maximum(v - hi, 0.0) + np.where(lo < end, antiderivative_below(end) - antiderivative_below(lo), 0.0)
    return np.where(noised, above + below, np.abs(np.clip(c, low, high) - v))


def expected_relative_errors(original, scales, *, lower: float, upper: float, epsilon: float, scale_basis: str) -> np.ndarray:
    """Per row, the expected relative error ``E|published − v|/|v|`` of one ε-quasi before any noise is drawn.

    ``scales``: the Laplace scale each row's noise is drawn with (:func:`kepsilon.engine.perturb.noise_scales`).
    Inputs are clamped to the public bounds before the noise, and the outputs (both bases) to the bounds
    rounded inwards to the public grid, exactly as :func:`kepsilon.engine.perturb.perturb` does; the
    expectation is :func:`expected_absolute_error`. A zero original has no relative error: its entry is NaN.
    The one definition behind the release's predicted error, the advisor's and the per-group figures.
    """
    original = np.asarray(original, dtype=np.float64)
    scales = np.asarray(scales, dtype=np.float64)
    centre = np.clip(original, lower, upper)
    # Both bases clamp the noisy value to the bounds rounded inwards to the public grid.
    low, high = grid_bounds(lower, upper, public_grid(lower, upper, epsilon))
    expected = expected_absolute_error(original, centre, scales, low, high)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(original != 0, expected / np.abs(original), np.nan)


def release_expected_errors(original: pd.DataFrame, scales: Mapping[str, np.ndarray], spec: ReleaseSpec) -> dict[str, np.ndarray]:
    """Per ε-quasi of ``spec``, :func:`expected_relative_errors` of every record of ``original`` on the scales
    its noise is drawn with (``scales``), with the column's public bounds and share of ε."""
    split = spec.epsilon_split()
    expected = {}
    for quasi in spec.roles.e_quasi:
        lower, upper = quasi.bounds()
        expected[quasi.column] = expected_relative_errors(
            original[quasi.column].to_numpy(dtype=np.float64), scales[quasi.column], lower=lower, upper=upper,
            epsilon=split[quasi.column], scale_basis=spec.scale_basis,
        )
    return expected


def e_quasi_metrics(
    original,
    noisy,
    class_ids,
    published,
    scales,
    *,
    column: str,
    lower: float,
    upper: float,
    epsilon: float,
    scale_basis: str,
) -> dict:
    """Loss and risk figures of one ε-quasi (all private).

    ``original``: the values before perturbation (unclamped); ``noisy``: as published, before
    suppression; ``scales``: the Laplace scale each row's noise was drawn with (``PerturbResult.scales``
    of the column); ``lower``, ``upper``, ``epsilon``: the column's public bounds and ε share, which
    fix the clamp and the public grid.

    Errors are over every perturbed record with a non-zero original (the relative error of a zero is
    undefined; such records are counted in ``zero_values_excluded``, not failing a release whose
    noise is already drawn): ``measured = mean |published − v|/|v|`` and ``predicted = mean
    E|published − v|/|v|`` with the expectation of :func:`expected_absolute_error` (``b`` per row in
    diameter mode, the input and output clamps included in both modes). Linking risk is over the
    published records only, since suppression exists to remove the linkable ones.
    """
    original = _values("original", original)
    noisy = _values("noisy", noisy, len(original))
    scales = _values("scales", scales, len(original))
    class_ids = np.asarray(class_ids)
    nonzero = original != 0
    expected = expected_relative_errors(
        original, scales, lower=lower, upper=upper, epsilon=epsilon, scale_basis=scale_basis
    )
    predicted = float(np.mean(expected[nonzero])) if nonzero.any() else 0.0
    return {
        "measured_relative_error": measured_relative_error(original[nonzero], noisy[nonzero], column),
        "predicted_relative_error": predicted,
        "linking_risk": linking_risk(original[published], noisy[published], class_ids[published]),
        "zero_values_excluded": int((~nonzero).sum()),
    }


def release_metrics(
    original: pd.DataFrame,
    noisy: pd.DataFrame,
    class_ids: np.ndarray,
    partition,
    suppression,
    spec,
    scales: Mapping[str, np.ndarray] | None = None,
) -> dict:
    """The private record's outcome figures: rows removed per stage, loss, risk and class statistics.

    ``original`` and ``noisy`` hold the records the anonymiser kept, aligned with ``class_ids``.
    ``scales``: the perturbation's scales per ε-quasi column (``PerturbResult.scales``), which the
    predicted error uses. Callers should pass them; when omitted they are derived with
    :func:`kepsilon.engine.perturb.noise_scales`, the definition the perturbation itself uses.
    """
    published = ~suppression.removed
    dense_ids, n_classes = dense_class_ids(class_ids, len(original))
    per_column = {}
    for quasi in spec.roles.e_quasi:
        epsilon = spec.epsilon_split()[quasi.column]
        values = original[quasi.column].to_numpy(dtype=np.float64)
        if scales is not None:
            column_scales = np.asarray(scales[quasi.column], dtype=np.float64)
        else:
            clamped = np.clip(values, quasi.lower, quasi.upper)
            column_scales = noise_scales(clamped, dense_ids, n_classes, quasi.lower, quasi.upper, epsilon, spec.scale_basis)
        per_column[quasi.column] = e_quasi_metrics(
            values,
            noisy[quasi.column].to_numpy(dtype=np.float64),
            class_ids,
            published,
            column_scales,
            column=quasi.column,
            lower=quasi.lower,
            upper=quasi.upper,
            epsilon=epsilon,
            scale_basis=spec.scale_basis,
        )
    rows_removed = {
        "anonymiser_suppression": int((~partition.kept).sum()),
        "confidence_suppression_record_rule": int(suppression.record_rule.sum()),
        "confidence_suppression_class_rule": int(suppression.class_rule.sum()),
    }
    if getattr(suppression, "criteria_rule", None) is not None:
        rows_removed["diversity_suppression"] = int(suppression.criteria_rule.sum())
    classes = class_statistics(class_ids[published], sum(rows_removed.values()))
    return metrics_summary(rows_removed, int(published.sum()), per_column, partition.report.get("precision"), classes)


def metrics_summary(rows_removed: dict, rows_published: int, per_column: dict, precision, classes: dict) -> dict:
    """The release's private metrics from its per-column figures: errors averaged over the ε-quasis,
    the largest linking risk of any of them, the counts and the class statistics. One shape for the
    in-memory and the partitioned paths."""
    columns = per_column.values()
    return {
        "rows_removed": rows_removed,
        "rows_published": rows_published,
        "information_loss": {
            "measured": float(np.mean([c["measured_relative_error"] for c in columns])) if columns else 0.0,
            "predicted": float(np.mean([c["predicted_relative_error"] for c in columns])) if columns else 0.0,
            "per_column": per_column,
            "k_quasi_precision": precision,
        },
        "linking_risk": max((c["linking_risk"] for c in columns), default=0.0),
        "classes": classes,
    }


def errors_by_class(original: pd.DataFrame, noisy: pd.DataFrame, class_ids, scales: Mapping[str, np.ndarray], spec: ReleaseSpec,
                    expected_errors: Mapping[str, np.ndarray] | None = None):
    """Per anonymiser class, the mean predicted and the mean measured relative error of its records.

    The same per-record figures as the release's (:func:`expected_relative_errors` on the scales the noise
    was drawn with, and ``|v' − v|/|v|``), averaged inside each class and then over the ε-quasis; records
    with a zero original are left out as in the release's figures. Returns two arrays, one entry per class
    (dense class order); a class with no non-zero value gets NaN. For the private per-group plot.
    ``expected_errors``: per ε-quasi, :func:`release_expected_errors` where the caller has them already.
    """
    dense_ids, n_classes = dense_class_ids(class_ids, len(original))
    if expected_errors is None:
        expected_errors = release_expected_errors(original, scales, spec)
    predicted, measured = [], []
    for quasi in spec.roles.e_quasi:
        values = original[quasi.column].to_numpy(dtype=np.float64)
        changed = noisy[quasi.column].to_numpy(dtype=np.float64)
        expected = expected_errors[quasi.column]
        nonzero = values != 0
        counts = np.bincount(dense_ids[nonzero], minlength=n_classes)
        with np.errstate(divide="ignore", invalid="ignore"):
            predicted.append(np.bincount(dense_ids[nonzero], weights=expected[nonzero], minlength=n_classes) / counts)
            actual = np.abs(changed[nonzero] - values[nonzero]) / np.abs(values[nonzero])
            measured.append(np.bincount(dense_ids[nonzero], weights=actual, minlength=n_classes) / counts)
    return np.mean(predicted, axis=0), np.mean(measured, axis=0)
