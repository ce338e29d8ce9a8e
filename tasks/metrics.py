"""Information loss and disclosure risk of a (k,ε)-anonymised release (method.md §6).

All functions take per-row arrays plus per-row class ids (non-negative integers, not necessarily
dense) and are vectorised: one sort per call, nothing quadratic per class.

Relative errors divide by ``|v|``: a zero original value has no relative error. Both error functions
therefore **refuse** (``InputError``) a column holding zeros rather than silently dropping records,
which would bias the figure; shift or rescale such a column before using relative error.
"""

import math
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from .errors import InputError, SpecError
from .perturb import class_diameters, dense_class_ids
from .suppress import ClassSortedValues


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
    sorted_values = original[index.order]
    sorted_classes = dense_ids[index.order]
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
    sizes = np.bincount(dense_ids, minlength=n_classes).astype(np.int64)
    n_kept = int(len(class_ids))
    n_total = n_kept + int(n_suppressed)
    return {
        "n_classes": int(n_classes),
        "records_kept": n_kept,
        "records_suppressed": int(n_suppressed),
        "smallest_class": int(sizes.min()) if n_classes else 0,
        "largest_class": int(sizes.max()) if n_classes else 0,
        "mean_class_size": float(sizes.mean()) if n_classes else 0.0,
        "discernibility": int((sizes**2).sum()) + int(n_suppressed) * n_total,
        "prosecutor_risk_mean": float(n_classes / n_kept) if n_kept else 0.0,
        "prosecutor_risk_max": float(1.0 / sizes.min()) if n_classes else 0.0,
    }


def e_quasi_metrics(original, noisy, class_ids, published, epsilon: float, bounds_width: float | None, column: str) -> dict:
    """Loss and risk figures of one ε-quasi.

    Errors are over every perturbed record (the population the formula predicts); linking risk over
    the published records only, since suppression exists to remove the linkable ones. Zero values,
    for which relative error is undefined, are left out of the error figures and counted instead of
    failing a release whose noise is already drawn. With public bounds the predicted error is
    ``(upper − lower)/ε`` times the mean of ``1/|v|`` (the same formula with the bounds as diameter).
    """
    nonzero = original != 0
    v, v_noisy, ids = original[nonzero], noisy[nonzero], class_ids[nonzero]
    if bounds_width is None:
        predicted = predicted_relative_error(v, ids, epsilon, column)
    else:
        predicted = float(bounds_width / epsilon * np.mean(1 / np.abs(v))) if len(v) else 0.0
    return {
        "measured_relative_error": measured_relative_error(v, v_noisy, column),
        "predicted_relative_error": predicted,
        "linking_risk": linking_risk(original[published], noisy[published], class_ids[published]),
        "zero_values_excluded": int((~nonzero).sum()),
    }


def release_metrics(original: pd.DataFrame, noisy: pd.DataFrame, class_ids: np.ndarray, partition, suppression, spec) -> dict:
    """The manifest's outcome figures: rows removed per stage, loss, risk and class statistics.

    ``original`` and ``noisy`` hold the records the anonymiser kept, aligned with ``class_ids``.
    """
    published = ~suppression.removed
    per_column = {}
    for quasi in spec.roles.e_quasi:
        width = (quasi.upper - quasi.lower) if spec.scale_basis == "bounds" else None
        per_column[quasi.column] = e_quasi_metrics(
            original[quasi.column].to_numpy(dtype=np.float64),
            noisy[quasi.column].to_numpy(dtype=np.float64),
            class_ids,
            published,
            spec.epsilon_split()[quasi.column],
            width,
            quasi.column,
        )
    rows_removed = {
        "anonymiser_suppression": int((~partition.kept).sum()),
        "confidence_suppression_record_rule": int(suppression.record_rule.sum()),
        "confidence_suppression_class_rule": int(suppression.class_rule.sum()),
    }
    columns = per_column.values()
    return {
        "rows_removed": rows_removed,
        "rows_published": int(published.sum()),
        "information_loss": {
            "measured": float(np.mean([c["measured_relative_error"] for c in columns])) if columns else 0.0,
            "predicted": float(np.mean([c["predicted_relative_error"] for c in columns])) if columns else 0.0,
            "per_column": per_column,
            "k_quasi_precision": partition.report.get("precision"),
        },
        "linking_risk": max((c["linking_risk"] for c in columns), default=0.0),
        "classes": class_statistics(class_ids[published], sum(rows_removed.values())),
    }


@task(name="metrics", cache_policy=NO_CACHE, persist_result=False)
def measure_release(original: pd.DataFrame, noisy: pd.DataFrame, class_ids: np.ndarray, partition, suppression, spec) -> dict:
    """Prefect task: information loss, linking risk and class statistics of the release."""
    return release_metrics(original, noisy, class_ids, partition, suppression, spec)
