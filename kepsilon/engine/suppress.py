"""Confidence-based suppression, "c-confident k-anonymity" (method.md §5).

An adversary who knows the original values builds, around each noisy value ``v'_i``, the interval
``[v'_i − r_c, v'_i + r_c]`` that holds the true value with probability ``c``; for Laplace noise of
scale ``b``, ``r_c = −b·ln(1 − c)``. With ``ℓ_i`` the number of the class's *original* values inside
record i's interval:

- record rule: suppress record i when ``0 < ℓ_i < k`` (``ℓ_i = 0``: the noise made the record an
  outlier that matches nobody, so it is kept);
- class rule: suppress the whole class when ``|ec| − |{i : ℓ_i < k}| < k``.

Guarantee: with ``ℓ_i`` counted over the class as it stood before this step, every published
record's c-confidence interval holds either no original of its class or at least k of them, and
every surviving class keeps at least k records whose interval holds ≥ k originals (so it keeps ≥ k
records). The rules are not iterated after removal (as in the paper), and they read the true
values, so they are themselves not differentially private (method.md §7).

Scale bases. :func:`suppress_records` applies the rules in ``scale_basis="diameter"`` only. In
``scale_basis="bounds"`` it removes nothing and says so in its report (``applied: False`` with the
reason): whether a record is published would depend on the true values (with k = 3, ε = 16 a class
{170, 170, 170} was published with probability 0.97 and, one height changed to 130, never), which
breaks "ε-differential privacy for the ε-quasis given the partition". With the step off, what
bounds mode publishes about the ε-quasis is the perturbation's output alone, so that guarantee holds.
The functions :func:`confidence_suppress` and :func:`confidence_suppress_columns` implement the rules
whatever the basis; it is the caller's choice to apply them.

``ℓ_i`` is computed for all records at once from one index of the originals by (class, value) and
a lookup or ``searchsorted`` call per interval end (see :class:`ClassSortedValues`): O(n log n) at most,
nothing quadratic per class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .criteria import declared, failing_group_rows
from .errors import SpecError
from .partition import published_labels
from .perturb import dense_class_ids
from .sorting import radix_sortable, stable_argsort, unique_inverse

if TYPE_CHECKING:
    from kepsilon.spec import ReleaseSpec  # the engine reads the spec; the model imports the engine


@dataclass
class SuppressionResult:
    """Boolean masks over the input rows and a count report (no data values).

    ``record_rule``: rows removed by ``0 < ℓ_i < k``. ``class_rule``: rows removed because their
    class fell below k, and not already removed by the record rule. ``removed``: their union.
    """

    record_rule: np.ndarray
    class_rule: np.ndarray
    removed: np.ndarray
    report: dict[str, Any]
    criteria_rule: np.ndarray | None = None  # rows of groups failing a sensitive criterion (None: none declared)


def _check_parameters(k: int, confidence: float) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise SpecError("k", "must be an integer ≥ 2")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) or not 0 < confidence < 1:
        raise SpecError("confidence", "must lie strictly between 0 and 1")


def _as_float_array(name: str, values, n_rows: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or len(array) != n_rows:
        raise SpecError(name, f"needs one value per row ({n_rows})")
    if not np.isfinite(array).all():
        raise SpecError(name, "holds missing or infinite values")
    return array


def confidence_radius(scales: np.ndarray, confidence: float) -> np.ndarray:
    """Half-width ``r_c = −b·ln(1 − c)`` of the c-confidence interval of Laplace noise of scale b."""
    return -scales * np.log1p(-confidence)


COUNTED_KEYS_PER_ROW = 4  # key spans up to this many keys a row are counted, not sorted (ClassSortedValues)


class ClassSortedValues:
    """Values sorted by (class, value), for exact per-class searches over all rows at once.

    Each value gets the integer key ``class·W + rank`` with ``rank`` its position among the distinct
    values (``W`` = their number + 1), so sorting keys sorts by class then value, and equal floats
    share a key. A query ``x`` of class ``c`` becomes ``c·W + searchsorted(distinct, x)``, which
    compares with the keys of class ``c`` exactly as ``x`` compares with the floats: the number of
    keys below the query answers the question for every row, whatever its class.

    Where the keys span few values for the rows (at most ``COUNTED_KEYS_PER_ROW`` a row: values with
    few distinct levels, such as heights or ages in whole units, in classes of tens of records), the
    keys are counted instead of sorted: a table of how many keys lie below each possible key (a prefix
    sum of their counts) answers a query by one lookup, where a search in the sorted keys costs a
    binary search (on a class partition of 500k records: 1 ms against 36 ms a call, and 13 ms to count
    against about 25 to sort). Otherwise they are sorted and searched. Both give the same positions.
    """

    def __init__(self, dense_ids: np.ndarray, values: np.ndarray):
        self.distinct, ranks = unique_inverse(values)
        self.width = np.int64(len(self.distinct) + 1)
        keys = dense_ids * self.width + ranks
        self._rows = dense_ids
        self._by_class: np.ndarray | None = None
        self._below: np.ndarray | None = None
        self._keys: np.ndarray | None = None
        span = (int(dense_ids.max()) + 1) * int(self.width) if len(keys) else 0
        if len(keys) and span <= COUNTED_KEYS_PER_ROW * len(keys):
            # below[q]: the keys smaller than q, for every q up to the span (int32 halves the table's memory)
            self._below = np.empty(span + 1, dtype=np.int32 if len(keys) < 2**31 else np.int64)
            self._below[0] = 0
            np.cumsum(np.bincount(keys, minlength=span), out=self._below[1:])
            return
        # Rows grouped by class first where the classes are few enough for a radix sort (a class partition's):
        # the keys then come class by class, which NumPy's merge of runs sorts 2.4-4 times faster than its
        # quicksort sorts them in row order, and the searches below walk them class by class. Same order:
        # the grouping is stable, so equal keys stay in row order.
        self._by_class = stable_argsort(dense_ids) if radix_sortable(dense_ids) else None
        if self._by_class is None:
            order = stable_argsort(keys)
        else:
            order = self._by_class[stable_argsort(keys[self._by_class])]
        self._keys = keys[order]

    @property
    def counted(self) -> bool:
        """Whether the keys were counted (a lookup table) rather than sorted."""
        return self._below is not None

    def sorted_keys(self) -> np.ndarray:
        """The keys in ascending order (made from the counts on first use where they were counted)."""
        if self._keys is None:
            below = self._below if self._below is not None else np.zeros(1, dtype=np.int64)
            self._keys = np.repeat(np.arange(len(below) - 1, dtype=np.int64), np.diff(below))
        return self._keys

    def sorted_values(self) -> tuple[np.ndarray, np.ndarray]:
        """The values in (class, value) order and their classes: ``sorted_keys`` read back (equal floats
        share a rank, so a value comes back as the distinct value it equals)."""
        keys = self.sorted_keys()
        return self.distinct[keys % self.width], keys // self.width

    def position(self, dense_ids: np.ndarray, bounds: np.ndarray, inclusive: bool) -> np.ndarray:
        """Per query row: index in the sorted values of the first value of its class that is
        ``≥ bound`` (``> bound`` if ``inclusive``), or the start of the next class if none is."""
        ranks = np.searchsorted(self.distinct, bounds, side="right" if inclusive else "left")
        queries = dense_ids * self.width + ranks
        if self._below is not None:
            # A class above the index's last has every key below its queries: the table's last entry.
            return self._below[np.minimum(queries, len(self._below) - 1)].astype(np.intp)
        keys = self.sorted_keys()
        # Searched class by class, or in sorted order: successive searches then walk the keys forwards
        # instead of probing them at random (a cache miss per step on a large partition). The answers are
        # the same. The index's own rows are grouped by class already (500k rows: 42 ms against 66 to sort
        # the queries first).
        by_query = self._by_class if dense_ids is self._rows and self._by_class is not None else stable_argsort(queries)
        found = np.empty(len(queries), dtype=np.intp)
        found[by_query] = np.searchsorted(keys, queries[by_query], side="left")
        return found


def matches_within_radius(original: np.ndarray, noisy: np.ndarray, dense_ids: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """``ℓ_i``: how many originals of row i's class lie in ``[noisy_i − r_i, noisy_i + r_i]``."""
    index = ClassSortedValues(dense_ids, original)
    at_most_high = index.position(dense_ids, noisy + radius, inclusive=True)
    below_low = index.position(dense_ids, noisy - radius, inclusive=False)
    return (at_most_high - below_low).astype(np.int64)


def confidence_suppress(
    original: np.ndarray,
    noisy: np.ndarray,
    class_ids: np.ndarray,
    scales: np.ndarray,
    k: int,
    confidence: float,
) -> SuppressionResult:
    """Apply the record and class rules of c-confident k-anonymity to one ε-quasi column.

    ``scales``: the Laplace scale b per row used by the perturbation (0 for zero-diameter classes,
    whose interval is the point itself, so ``ℓ_i`` is the class size there and nothing is removed
    for classes of ≥ k). ``class_ids``: one non-negative integer per row, not necessarily dense.
    """
    _check_parameters(k, confidence)
    n_rows = len(np.asarray(original))
    original = _as_float_array("original", original, n_rows)
    noisy = _as_float_array("noisy", noisy, n_rows)
    scales = _as_float_array("scales", scales, n_rows)
    if (scales < 0).any():
        raise SpecError("scales", "must be non-negative")
    dense_ids, n_classes = dense_class_ids(class_ids, n_rows)

    matches = matches_within_radius(original, noisy, dense_ids, confidence_radius(scales, confidence))
    below_k = matches < k
    record_rule = below_k & (matches > 0)
    class_sizes = np.bincount(dense_ids, minlength=n_classes)
    below_k_per_class = np.bincount(dense_ids, weights=below_k, minlength=n_classes)
    failing_classes = class_sizes - below_k_per_class < k
    class_rule = failing_classes[dense_ids] & ~record_rule
    removed = record_rule | class_rule
    report = {
        "k": int(k),
        "confidence": float(confidence),
        "records": int(n_rows),
        "outliers_kept": int((matches == 0).sum()),
        "removed_by_record_rule": int(record_rule.sum()),
        "removed_by_class_rule": int(class_rule.sum()),
        "classes_removed": int(failing_classes.sum()),
        "removed": int(removed.sum()),
    }
    return SuppressionResult(record_rule=record_rule, class_rule=class_rule, removed=removed, report=report)


def confidence_suppress_columns(
    originals: Mapping[str, np.ndarray],
    noisy: Mapping[str, np.ndarray],
    class_ids: np.ndarray,
    scales: Mapping[str, np.ndarray],
    k: int,
    confidence: float,
) -> SuppressionResult:
    """Confidence suppression for several ε-quasis: a record goes if any column's rules flag it.

    ``originals``, ``noisy`` and ``scales`` map each ε-quasi column to its per-row array (a
    DataFrame works for the first two). ``record_rule`` is the union of the columns' record rules;
    ``class_rule`` the union of their class rules, plus every class left with fewer than k records
    once the union is removed (so the output stays k-anonymous), minus rows already in
    ``record_rule``.

    Limitation: the rule is applied per attribute. An adversary who combines the intervals of d
    ε-quasis has a joint region of confidence ``c^d`` (not c) that can hold fewer than k originals
    even when every per-column interval holds k or more; such records are not suppressed here.
    """
    _check_parameters(k, confidence)
    columns = list(scales)
    n_rows = len(np.asarray(class_ids))
    record_rule = np.zeros(n_rows, dtype=bool)
    class_rule = np.zeros(n_rows, dtype=bool)
    per_column = {}
    for column in columns:
        result = confidence_suppress(
            np.asarray(originals[column]), np.asarray(noisy[column]), class_ids, scales[column], k, confidence
        )
        record_rule |= result.record_rule
        class_rule |= result.class_rule
        per_column[column] = result.report
    dense_ids, n_classes = dense_class_ids(class_ids, n_rows)
    removed = record_rule | class_rule
    survivors = np.bincount(dense_ids, weights=~removed, minlength=n_classes)
    shrunk_classes = (survivors > 0) & (survivors < k)
    class_rule = (class_rule | shrunk_classes[dense_ids]) & ~record_rule
    removed = record_rule | class_rule
    report = {
        "k": int(k),
        "confidence": float(confidence),
        "records": int(n_rows),
        "removed_by_record_rule": int(record_rule.sum()),
        "removed_by_class_rule": int(class_rule.sum()),
        "classes_removed_after_union": int(shrunk_classes.sum()),
        "removed": int(removed.sum()),
        "columns": per_column,
    }
    return SuppressionResult(record_rule=record_rule, class_rule=class_rule, removed=removed, report=report)


BOUNDS_MODE_REASON = (
    "not applied in scale_basis=bounds: the rules read the true values, so applying them would break "
    "ε-differential privacy for the ε-quasis given the partition"
)


def suppress_records(original: pd.DataFrame, noisy: pd.DataFrame, class_ids: np.ndarray, scales: dict, spec: ReleaseSpec) -> SuppressionResult:
    """c-confident suppression over the spec's ε-quasis, with its k and confidence.

    ``scale_basis="diameter"``: the record and class rules of :func:`confidence_suppress_columns`,
    report ``applied: True``. ``scale_basis="bounds"``: removes nothing and reads no value (neither
    the originals nor the noisy ones), report ``applied: False`` with the reason; see the module
    docstring for why.
    """
    columns = [quasi.column for quasi in spec.roles.e_quasi]
    if spec.scale_basis == "bounds":
        _check_parameters(spec.k, spec.confidence)
        n_rows = len(np.asarray(class_ids))
        nothing = np.zeros(n_rows, dtype=bool)
        report = {
            "applied": False,
            "reason": BOUNDS_MODE_REASON,
            "k": int(spec.k),
            "confidence": float(spec.confidence),
            "records": int(n_rows),
            "removed_by_record_rule": 0,
            "removed_by_class_rule": 0,
            "classes_removed_after_union": 0,
            "removed": 0,
            "columns": {},
        }
        return SuppressionResult(record_rule=nothing, class_rule=nothing.copy(), removed=nothing.copy(), report=report)
    result = confidence_suppress_columns(
        {c: original[c].to_numpy(dtype=np.float64) for c in columns},
        {c: noisy[c].to_numpy(dtype=np.float64) for c in columns},
        class_ids,
        {c: scales[c] for c in columns},
        spec.k,
        spec.confidence,
    )
    result.report = {"applied": True, **result.report}
    return result


def suppress_failing_groups(kept: pd.DataFrame, class_ids: np.ndarray, suppression: SuppressionResult, partition,
                            roles: dict) -> SuppressionResult:
    """Remove the published groups that fail a declared sensitive criterion ("diversity suppression").

    The anonymiser's classes meet the criteria, but confidence suppression removes records after it,
    which can leave a class homogeneous or far from the table's distribution. So the groups are formed
    as they will be published (labels from the records still published, rows sharing all labels) and a
    failing group is removed whole. Removing whole groups changes no other group's labels (a class's
    labels come from its own published members), so one pass leaves every published group meeting the
    criteria. In bounds mode nothing was removed after the anonymiser and groups are unions of classes
    that meet them (ℓ-distinct and entropy/recursive ℓ are kept by unions, EMD is convex), so nothing is
    removed here either. Counted against the suppression budget like every stage.
    """
    enforced = declared(partition.criteria)
    if not enforced:
        return suppression
    published = ~suppression.removed
    labels = published_labels(kept[roles["k_quasi"]], class_ids, published, partition.hierarchies, partition.levels)
    failing = failing_group_rows(labels, kept, published, enforced)
    return SuppressionResult(
        record_rule=suppression.record_rule,
        class_rule=suppression.class_rule,
        removed=suppression.removed | failing,
        report={**suppression.report, "removed_by_criteria": int(failing.sum())},
        criteria_rule=failing,
    )
