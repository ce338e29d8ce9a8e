"""Mondrian k-anonymisation: strict multidimensional partitioning (LeFevre, DeWitt, Ramakrishnan 2006).

Guarantee: every record of the output belongs to an equivalence class of at least ``k`` records, and
all records of a class carry the same released k-quasi values; hence every combination of released
k-quasi values is shared by at least ``k`` records (two classes may even release the same values,
which only makes the groups larger). Nothing is suppressed. This is k-anonymity and nothing more:
the cut points are chosen from the private data, and the released ranges/labels say which values
occur in each class.

The method (method.md §3), exactly:

* A partition is split on the k-quasi with the widest *normalised* range, at the median, while both
  halves keep at least ``k`` records; if that dimension cannot be split the next widest is tried;
  a partition no dimension can split is an equivalence class.
* Normalised range of a partition on a dimension:
  numeric column — (max − min within the partition) / (max − min over the whole table), 0 if the
  table holds one value; categorical or text column — the number of distinct codes the partition
  spans, ``hi − lo + 1``, divided by the number of distinct values in the whole table (codes are
  dense ranks over the values present in the table, so leaves missing from the data do not count).
  Equal widths go to the column listed first.
* Median cut on a dimension of a partition of ``m`` records, in the dimension's order: let ``v`` be
  the lower median value (the ``⌈m/2⌉``-th smallest). The cut puts ``values ≤ v`` on the left and
  ``values > v`` on the right. If ties at ``v`` leave fewer than ``k`` on the right, the cut moves
  below the tie run (left ``values < v``). If that leaves fewer than ``k`` on the left too, the
  dimension cannot split this partition. The cut never separates equal values.

Columns are ordered as follows: a column with a hierarchy by its leaves' file order (siblings are
adjacent in well-made hierarchies, so cuts tend to follow the hierarchy), a numeric column by value,
any other column by its sorted distinct string values.

Release of a class's value: a column with a hierarchy gets the label of the lowest hierarchy level at
which all the class's members agree; a numeric column gets ``[lo-hi]`` (just ``lo`` if the class holds
one value); another column gets the set of its values in the class, ``{a,b}`` (just ``a`` if one).

Vectorised: a cut never separates equal values, so rows with the same k-quasi tuple always share a
class; the recursion runs on the distinct tuples weighted by their row counts. All partitions of
one depth are split at once. For every dimension the tuples are kept in one array ordered by
(partition, value); partitions occupy the same contiguous blocks in every dimension's array, so
per-partition minimum, maximum and weighted median are gathers and binary searches at block
offsets, and a split is a stable in-block partition computed with cumulative sums. The cost is one
sort per dimension plus O(u · d) per depth (u distinct tuples, d k-quasis), O(u · d · log(n/k))
overall; nothing is quadratic and there is no Python loop over records or partitions.

The recursion's input is the table's weighted histogram of distinct tuples
(``kepsilon.engine.histogram``): :func:`mondrian_classes` takes it directly, which is how a partitioned
table too large for one process is anonymised (its histogram is built by a reduction);
:func:`mondrian` builds it from a frame in memory and maps the classes back to the records, so both
paths give the same classes.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .criteria import ColumnCriteria, declared, group_value_counts
from .errors import InputError, SpecError
from .hierarchy import Hierarchy, categorical_precision, lowest_common_levels
from .histogram import TupleHistogram, pair_codes, tuple_histogram
from .partition import Partition, TupleClasses, check_anonymiser_parameters, check_histogram_parameters

ALGORITHM = "mondrian"


@dataclass(frozen=True)
class _Dimension:
    """One k-quasi column encoded for partitioning.

    ``codes`` are dense ranks 0..n_distinct-1 of each row's value in the column's order. A partition
    whose codes run from ``lo`` to ``hi`` has normalised width
    ``(upper_edge[hi] - lower_edge[lo]) / scale``: for numeric columns both edges are the values
    themselves and the scale is the table's range; for the others a code is a unit cell and the scale
    is the number of distinct values.
    """

    name: str
    kind: str  # "hierarchy" | "interval" | "set"
    codes: np.ndarray
    lower_edge: np.ndarray
    upper_edge: np.ndarray
    scale: float
    distinct: np.ndarray  # per code: leaf code (hierarchy), number (interval), string (set)
    hierarchy: Hierarchy | None = None

    @property
    def n_distinct(self) -> int:
        return len(self.distinct)


@dataclass(frozen=True)
class _Units:
    """The distinct encoded k-quasi tuples ("units"), each with its record count.

    Rows here are the histogram's tuples; two tuples whose values encode alike (the integer 1 and the
    text "1" matched to one hierarchy leaf) are one unit.
    """

    of_row: np.ndarray  # unit of every histogram row
    codes: list[np.ndarray]  # per dimension, the code of every unit
    weights: np.ndarray  # records per unit
    first_rows: np.ndarray  # source position of the first record of every unit


@dataclass(frozen=True)
class _Classes:
    """Equivalence classes found by the recursion, numbered 0..n-1 by their first row.

    ``low_codes[j][c]`` / ``high_codes[j][c]`` are the smallest / largest code of class ``c`` on
    dimension ``j`` (read off the sorted blocks when the class is closed, so no extra pass is needed).
    """

    ids: np.ndarray  # class of every histogram row
    unit_ids: np.ndarray  # class of every unit
    units: _Units
    sizes: np.ndarray
    first_rows: np.ndarray  # source position of the first record of every class
    first_units: np.ndarray  # the unit holding that record, one member per class
    low_codes: list[np.ndarray]
    high_codes: list[np.ndarray]


def mondrian(
    frame: pd.DataFrame,
    columns: list[str],
    k: int,
    hierarchies: dict[str, Hierarchy],
    criteria: list[ColumnCriteria] | None = None,
) -> Partition:
    """k-anonymise ``frame`` on the k-quasi ``columns`` with strict multidimensional Mondrian.

    ``criteria``: sensitive-column criteria (ℓ-diversity, t-closeness; ``kepsilon.engine.criteria``). A
    cut is allowed only when both halves meet every declared one, as well as holding ≥ k records; the
    whole table must meet them (else ``SpecError`` naming the column).

    ``hierarchies`` maps a column to its hierarchy (entries for other columns are ignored); such a
    column is categorical and released as the lowest common hierarchy label of each class. A numeric
    column without one is released as value ranges, any other column as value sets. Deterministic:
    the same input gives the same classes and the same class ids. See the module docstring for the
    exact widths, cut and guarantee.

    Returns a ``Partition`` whose report holds: algorithm, k, rows, kept_rows, suppressed_rows,
    n_classes, smallest_class, largest_class, mean_class_size, precision (per column, the mean over
    records of the information loss: level/(h-1) for hierarchies, interval width / attribute range for
    numbers, (set size-1)/(distinct values-1) for sets; 0 = exact, 1 = fully generalised),
    generalisation (per column, a summary without any data value) and hierarchies (column → SHA-256
    of the hierarchy file used).

    Raises SpecError ('k', 'columns') for a bad parameter, InputError for a missing column, an empty
    frame, missing or non-finite values, HierarchyError for a value that is not a leaf of its hierarchy.
    """
    check_anonymiser_parameters(frame, columns, k)
    histogram = tuple_histogram(frame, columns, declared(criteria or []))
    return mondrian_classes(histogram, columns, k, hierarchies, criteria).partition(frame.index, histogram.tuple_of_record())


def mondrian_classes(
    histogram: TupleHistogram,
    columns: list[str],
    k: int,
    hierarchies: dict[str, Hierarchy],
    criteria: list[ColumnCriteria] | None = None,
) -> TupleClasses:
    """Mondrian on a table's histogram of distinct k-quasi tuples (``kepsilon.engine.histogram``):
    the class of every tuple, the classes' released labels and the report :func:`mondrian` gives.

    ``histogram.pairs`` must hold the (tuple, value) pairs of every declared criterion. Same
    parameters, guarantee and refusals as :func:`mondrian`; the classes are the ones :func:`mondrian`
    finds on the records the histogram counts.
    """
    check_histogram_parameters(histogram, columns, k)
    dimensions = [_encode(histogram.tuples[column], hierarchies.get(column)) for column in columns]
    units = _distinct_tuples(dimensions, histogram.weights, histogram.first)
    sensitive = _SensitiveCounts.build(declared(criteria or []), histogram, units)
    classes = _split_into_classes(dimensions, units, k, sensitive)

    released, precision, generalisation = {}, {}, {}
    for j, dimension in enumerate(dimensions):
        labels, class_loss, summary = _release(dimension, classes, j)
        released[dimension.name] = pd.array(labels, dtype=str).take(classes.ids)
        precision[dimension.name] = float(np.average(class_loss, weights=classes.sizes))
        generalisation[dimension.name] = summary

    rows = histogram.records
    report = {
        "algorithm": ALGORITHM,
        "k": int(k),
        "rows": rows,
        "kept_rows": rows,
        "suppressed_rows": 0,
        "n_classes": int(len(classes.sizes)),
        "smallest_class": int(classes.sizes.min()),
        "largest_class": int(classes.sizes.max()),
        "mean_class_size": float(classes.sizes.mean()),
        "precision": precision,
        "generalisation": generalisation,
        "hierarchies": {d.name: d.hierarchy.sha256 for d in dimensions if d.hierarchy is not None},
    }
    return TupleClasses(class_of_tuple=classes.ids, released=pd.DataFrame(released), report=report)


def _encode(values: pd.Series, hierarchy: Hierarchy | None) -> _Dimension:
    """Encode one k-quasi column as dense ordered codes (see the module docstring for the orders)."""
    if hierarchy is not None:
        return _encode_hierarchical(values, hierarchy)
    if pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype):
        return _encode_numeric(values)
    if values.isna().any():
        raise InputError(values.name, "has missing values; a k-quasi must be complete")
    distinct, codes = _sorted_distinct(values.astype(str).to_numpy(dtype=object))
    cells = np.arange(len(distinct), dtype=np.float64)
    return _Dimension(values.name, "set", codes, cells, cells + 1.0, float(len(distinct)), distinct)


def _encode_hierarchical(values: pd.Series, hierarchy: Hierarchy) -> _Dimension:
    """Leaf codes in file order, re-ranked densely over the leaves present in the data.

    The column is factorised first so that the string matching against the leaves runs once per
    distinct value, not once per row.
    """
    value_codes, distinct_values = pd.factorize(values, use_na_sentinel=False)
    leaf_codes = hierarchy.leaf_codes(pd.Series(distinct_values, name=values.name))[value_codes]
    present = np.bincount(leaf_codes, minlength=len(hierarchy.leaves)) > 0
    dense_of_leaf = np.cumsum(present) - 1
    distinct_leaves = np.flatnonzero(present)
    if hierarchy.leaf_numbers is not None:
        # A built numeric or date hierarchy: widths are measured on the numbers, as for a numeric column.
        edges = np.asarray(hierarchy.leaf_numbers, dtype=np.float64)[distinct_leaves]
        lower_edge, upper_edge = edges, edges
        spread = float(edges[-1] - edges[0]) if len(edges) else 0.0
        scale = spread if spread > 0 else 1.0
    else:
        lower_edge = np.arange(len(distinct_leaves), dtype=np.float64)
        upper_edge = lower_edge + 1.0
        scale = float(len(distinct_leaves))
    return _Dimension(
        values.name,
        "hierarchy",
        dense_of_leaf[leaf_codes].astype(np.int64),
        lower_edge,
        upper_edge,
        scale,
        distinct_leaves,
        hierarchy,
    )


def _encode_numeric(values: pd.Series) -> _Dimension:
    """Dense ranks of the numbers; integers stay integers so that ranges print exactly."""
    if pd.api.types.is_integer_dtype(values.dtype) and not values.hasnans:
        numbers = values.to_numpy(dtype=np.int64)
    else:
        numbers = values.to_numpy(dtype=np.float64, na_value=np.nan)
        if not np.isfinite(numbers).all():
            raise InputError(values.name, "has missing or infinite values; a numeric k-quasi must be finite")
    distinct, codes = _sorted_distinct(numbers)
    edges = distinct.astype(np.float64)
    table_range = float(edges[-1] - edges[0])
    return _Dimension(values.name, "interval", codes, edges, edges, table_range if table_range > 0 else 1.0, distinct)


def _sorted_distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and each value's rank among them (int64)."""
    distinct, codes = np.unique(values, return_inverse=True)
    return distinct, codes.reshape(-1).astype(np.int64)


def _distinct_tuples(dimensions: list[_Dimension], weights: np.ndarray, first: np.ndarray) -> _Units:
    """Group the histogram's rows by their encoded tuple (one sort of a combined integer key)."""
    key = np.zeros(len(dimensions[0].codes), dtype=np.int64)
    key_bound = 1
    for dimension in dimensions:
        if key_bound * dimension.n_distinct >= 2**62:  # keep the mixed-radix key inside int64
            key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
            key_bound = int(key.max()) + 1
        key = key * dimension.n_distinct + dimension.codes
        key_bound *= dimension.n_distinct
    _, representative, of_row = np.unique(key, return_index=True, return_inverse=True)
    of_row = of_row.reshape(-1).astype(np.int64)
    n_units = len(representative)
    first_rows = np.full(n_units, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_rows, of_row, np.asarray(first, dtype=np.int64))
    return _Units(
        of_row=of_row,
        codes=[dimension.codes[representative] for dimension in dimensions],
        weights=np.bincount(of_row, weights=weights, minlength=n_units).astype(np.int64),
        first_rows=first_rows,
    )


@dataclass(frozen=True)
class _SensitiveCounts:
    """Per declared sensitive column: (unit, value) pairs with their record counts, to count the
    sensitive values of any set of units (a cut's halves) with one bincount."""

    criteria: list
    pairs: list  # per column: (unit of pair, value code of pair, records of pair)

    @classmethod
    def build(cls, criteria: list, histogram: TupleHistogram, units: _Units) -> "_SensitiveCounts | None":
        if not criteria:
            return None
        pairs = []
        for criterion in criteria:
            m = len(criterion.domain)
            tuple_of_pair, code, records = pair_codes(histogram, criterion)
            unique, inverse = np.unique(units.of_row[tuple_of_pair] * m + code, return_inverse=True)
            counts = np.bincount(inverse.reshape(-1), weights=records, minlength=len(unique)).astype(np.int64)
            pairs.append((unique // m, unique % m, counts))
        return cls(criteria, pairs)

    def satisfied(self, unit_group: np.ndarray, n_groups: int) -> np.ndarray:
        """Whether each group of units (``unit_group[u]``, −1: in none) meets every declared criterion."""
        ok = np.ones(n_groups, dtype=bool)
        for criterion, (unit, value, count) in zip(self.criteria, self.pairs):
            group = unit_group[unit]
            inside = group >= 0
            counts = group_value_counts(group[inside], value[inside], n_groups, len(criterion.domain), count[inside])
            ok &= criterion.satisfied(counts)
        return ok

    def check_whole_table(self, n_units: int) -> None:
        """Refuse when the whole table fails a criterion: no partition of it can meet it."""
        for criterion, (unit, value, count) in zip(self.criteria, self.pairs):
            counts = group_value_counts(np.zeros(len(unit), dtype=np.int64), value, 1, len(criterion.domain), count)
            if not criterion.satisfied(counts)[0]:
                raise SpecError(
                    f"roles.sensitive.{criterion.column}", "the whole table does not meet its criteria; no release can"
                )


def _split_into_classes(
    dimensions: list[_Dimension], units: _Units, k: int, sensitive: "_SensitiveCounts | None" = None
) -> _Classes:
    """Run the Mondrian recursion breadth-first, one depth per iteration, all partitions at once.

    The recursion works on distinct k-quasi tuples weighted by their row counts: a cut never separates
    equal values, so equal tuples always end in the same class. Invariant: ``orders[j]`` lists the
    tuples of the partitions still being split, partition after partition in the same block layout
    (``block_tuples``) for every ``j``, each block sorted by dimension ``j``'s code. Closed partitions
    leave the arrays, so the work shrinks with depth.
    """
    n_units = len(units.weights)
    if sensitive is not None:
        sensitive.check_whole_table(n_units)
    orders = [np.argsort(codes, kind="stable") for codes in units.codes]
    block_tuples = np.array([n_units], dtype=np.int64)
    block_rows = np.array([int(units.weights.sum())], dtype=np.int64)
    unit_class = np.empty(n_units, dtype=np.int64)
    closed_low: list[list[np.ndarray]] = [[] for _ in dimensions]
    closed_high: list[list[np.ndarray]] = [[] for _ in dimensions]
    n_closed = 0
    while len(block_tuples):
        cut = _choose_cuts(dimensions, units, orders, block_tuples, block_rows, k, sensitive)
        closing = cut.left_tuples == 0
        if closing.any():
            closing_units = np.repeat(closing, block_tuples)
            n_closing = int(closing.sum())
            unit_class[orders[0][closing_units]] = np.repeat(
                np.arange(n_closed, n_closed + n_closing), block_tuples[closing]
            )
            for j in range(len(dimensions)):
                closed_low[j].append(cut.lows[j][closing])
                closed_high[j].append(cut.highs[j][closing])
            n_closed += n_closing
            going_on = ~closing
            orders = [order[~closing_units] for order in orders]
            block_tuples, block_rows = block_tuples[going_on], block_rows[going_on]
            cut = cut.only(going_on)
        if len(block_tuples):
            orders = _split_blocks(orders, block_tuples, cut.dimension, cut.left_tuples, n_units)
            block_tuples = _interleave(cut.left_tuples, block_tuples - cut.left_tuples)
            block_rows = _interleave(cut.left_rows, block_rows - cut.left_rows)
    return _number_by_first_row(
        units,
        unit_class,
        [np.concatenate(low) for low in closed_low],
        [np.concatenate(high) for high in closed_high],
    )


def _interleave(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``first[0], second[0], first[1], second[1], ...``: the children of each block, left then right."""
    return np.column_stack((first, second)).reshape(-1)


def _block_starts(block_sizes: np.ndarray) -> np.ndarray:
    """Offset of every block in an array of consecutive blocks of the given sizes."""
    starts = np.zeros(len(block_sizes), dtype=np.int64)
    np.cumsum(block_sizes[:-1], out=starts[1:])
    return starts


@dataclass(frozen=True)
class _Cuts:
    """Per block: the dimension to cut on (-1: none), the left half's tuples and rows (0: the block
    is a class), and every dimension's smallest and largest code in the block."""

    dimension: np.ndarray
    left_tuples: np.ndarray
    left_rows: np.ndarray
    lows: list[np.ndarray]
    highs: list[np.ndarray]

    def only(self, selected: np.ndarray) -> "_Cuts":
        return _Cuts(self.dimension[selected], self.left_tuples[selected], self.left_rows[selected], [], [])


def _choose_cuts(dimensions, units, orders, block_tuples, block_rows, k, sensitive=None) -> _Cuts:
    """Choose every block's cut: the widest dimension among those whose median cut keeps ≥ k rows on
    each side (and, with ``sensitive`` criteria, leaves both halves meeting them), which is the same as
    trying the dimensions from widest to narrowest."""
    starts = _block_starts(block_tuples)
    ends = starts + block_tuples
    block_of = np.repeat(np.arange(len(block_tuples)), block_tuples)
    best_width = np.full(len(block_tuples), -np.inf)
    best = _Cuts(
        np.full(len(block_tuples), -1, dtype=np.int64),
        np.zeros(len(block_tuples), dtype=np.int64),
        np.zeros(len(block_tuples), dtype=np.int64),
        [],
        [],
    )
    for j, (dimension, order) in enumerate(zip(dimensions, orders)):
        sorted_codes = np.take(units.codes[j], order)
        rows_before = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(np.take(units.weights, order), out=rows_before[1:])
        low, high = sorted_codes[starts], sorted_codes[ends - 1]
        best.lows.append(low)
        best.highs.append(high)
        left_tuples, left_rows = _median_cut(
            sorted_codes, rows_before, block_of, starts, block_rows, dimension.n_distinct, k
        )
        width = (dimension.upper_edge[high] - dimension.lower_edge[low]) / dimension.scale
        allowed = left_tuples > 0
        if sensitive is not None and allowed.any():
            allowed &= _halves_satisfy(sensitive, order, starts, block_of, left_tuples, len(units.weights))
        better = allowed & (width > best_width)
        best_width[better] = width[better]
        best.dimension[better] = j
        best.left_tuples[better] = left_tuples[better]
        best.left_rows[better] = left_rows[better]
    return best


def _halves_satisfy(sensitive, order, starts, block_of, left_tuples, n_units) -> np.ndarray:
    """Per block: whether both halves of its cut (the first ``left_tuples`` tuples of the block in
    ``order``, and the rest) meet every declared sensitive criterion."""
    position = np.arange(len(order))
    in_left = position - starts[block_of] < left_tuples[block_of]
    n_blocks = len(starts)
    unit_half = np.full(n_units, -1, dtype=np.int64)
    unit_half[order] = 2 * block_of + np.where(in_left, 0, 1)  # group 2b: left half of b, 2b+1: right half
    both = sensitive.satisfied(unit_half, 2 * n_blocks).reshape(n_blocks, 2)
    return both[:, 0] & both[:, 1]


def _median_cut(sorted_codes, rows_before, block_of, starts, block_rows, n_distinct, k):
    """Each block's median cut on one dimension: (left tuples, left rows), (0, 0) where no cut keeps
    ≥ k rows a side.

    Cut at the lower median v (the ⌈m/2⌉-th smallest of the block's m rows): left = values ≤ v; if
    that leaves < k rows on the right, left = values < v; if that leaves < k on the left, no cut.
    ``rows_before[i]`` counts the rows of the tuples before position i. Blocks are sorted, so
    ``block · n_distinct + code`` increases along the whole array and each boundary is one binary
    search.
    """
    rows_at_start = rows_before[starts]
    median_at = np.searchsorted(rows_before[1:], rows_at_start + (block_rows + 1) // 2, side="left")
    keys = block_of * n_distinct + sorted_codes
    median_keys = np.arange(len(starts)) * n_distinct + sorted_codes[median_at]
    end_at_most = np.searchsorted(keys, median_keys, side="right")
    end_below = np.searchsorted(keys, median_keys, side="left")
    rows_at_most = rows_before[end_at_most] - rows_at_start
    rows_below = rows_before[end_below] - rows_at_start
    take_at_most = block_rows - rows_at_most >= k
    take_below = ~take_at_most & (rows_below >= k)
    left_tuples = np.where(take_at_most, end_at_most - starts, np.where(take_below, end_below - starts, 0))
    left_rows = np.where(take_at_most, rows_at_most, np.where(take_below, rows_below, 0))
    return left_tuples, left_rows


def _split_blocks(orders, block_tuples, cut_dimension, left_tuples, n_units) -> list[np.ndarray]:
    """Split every block in two (left tuples, then right tuples) in every dimension's order.

    A block's left half is its first ``left_tuples`` tuples in the order of its cut dimension. Each
    dimension's block is then stably partitioned: a left tuple moves to the block start plus the
    number of left tuples before it; a right one to the block start plus the left size plus the number
    of right tuples before it. Relative order, hence sortedness, is kept within each half.
    """
    starts = _block_starts(block_tuples)
    block_start = np.repeat(starts, block_tuples)
    left_size = np.repeat(left_tuples, block_tuples)
    position = np.arange(len(block_start))
    in_left_half_of_cut = position - block_start < left_size

    goes_left = np.zeros(n_units, dtype=bool)
    unit_dimension = np.repeat(cut_dimension, block_tuples)
    for j, order in enumerate(orders):
        cut_here = unit_dimension == j
        goes_left[order[cut_here]] = in_left_half_of_cut[cut_here]

    right_base = left_size + position  # right target = block start + left size + (offset - lefts before)
    split = []
    for order in orders:
        is_left = np.take(goes_left, order)
        lefts_before = np.cumsum(is_left) - is_left
        lefts_before -= np.repeat(lefts_before[starts], block_tuples)
        target = np.where(is_left, block_start + lefts_before, right_base - lefts_before)
        reordered = np.empty_like(order)
        reordered[target] = order
        split.append(reordered)
    return split


def _number_by_first_row(units: _Units, unit_class: np.ndarray, low_codes: list, high_codes: list) -> _Classes:
    """Renumber classes 0..n-1 in the order of their first record, so ids do not depend on the recursion."""
    n_classes = len(low_codes[0])
    first_rows = np.full(n_classes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_rows, unit_class, units.first_rows)
    order = np.argsort(first_rows)
    renumber = np.empty(n_classes, dtype=np.int64)
    renumber[order] = np.arange(n_classes)
    unit_ids = renumber[unit_class]
    by_class = np.lexsort((units.first_rows, unit_ids))  # per class, its units from the first record on
    starts = np.flatnonzero(np.r_[True, unit_ids[by_class][1:] != unit_ids[by_class][:-1]])
    first_units = np.empty(n_classes, dtype=np.int64)
    first_units[unit_ids[by_class][starts]] = by_class[starts]
    return _Classes(
        ids=unit_ids[units.of_row],
        unit_ids=unit_ids,
        units=units,
        sizes=np.bincount(unit_ids, weights=units.weights, minlength=n_classes).astype(np.int64),
        first_rows=first_rows[order],
        first_units=first_units,
        low_codes=[low[order] for low in low_codes],
        high_codes=[high[order] for high in high_codes],
    )


def _release(dimension: _Dimension, classes: _Classes, j: int):
    """Per class: released label and information loss; plus a summary holding no data value."""
    if dimension.kind == "hierarchy":
        return _release_hierarchical(dimension, classes, j)
    if dimension.kind == "interval":
        return _release_interval(dimension, classes.low_codes[j], classes.high_codes[j], classes.sizes)
    return _release_set(dimension, classes, j)


def _release_hierarchical(dimension: _Dimension, classes: _Classes, j: int):
    """Lowest common hierarchy label per class; loss level/(h-1)."""
    hierarchy = dimension.hierarchy
    if hierarchy is None:
        raise ValueError(f"{dimension.name}: a hierarchical dimension without its hierarchy")
    leaf_codes = dimension.distinct[classes.units.codes[j][classes.first_units]]  # one member per class
    unit_leaf_codes = dimension.distinct[classes.units.codes[j]]
    levels = lowest_common_levels(unit_leaf_codes, classes.unit_ids, hierarchy)  # units suffice: same classes
    labels = np.empty(len(levels), dtype=object)
    for level in np.unique(levels):  # one gather per level, not one per class
        at_level = levels == level
        labels[at_level] = hierarchy.labels[level][leaf_codes[at_level]]
    loss = np.broadcast_to(categorical_precision(levels, hierarchy.height), levels.shape)
    records_per_level = np.bincount(levels, weights=classes.sizes, minlength=hierarchy.height)
    summary = {
        "kind": "hierarchy",
        "height": hierarchy.height,
        "records_per_level": {str(level): int(count) for level, count in enumerate(records_per_level)},
        "classes_per_level": {
            str(level): int(count) for level, count in enumerate(np.bincount(levels, minlength=hierarchy.height))
        },
    }
    return labels, loss, summary


def _format_numbers(numbers: np.ndarray) -> np.ndarray:
    """Shortest round-trip text of each number; integral floats print without a trailing '.0'."""
    if numbers.dtype.kind in "iu":
        return numbers.astype(str).astype(object)
    text = numbers.astype(str)
    integral = (numbers == np.round(numbers)) & (np.abs(numbers) < 2**53)
    text[integral] = numbers[integral].astype(np.int64).astype(str)
    return text.astype(object)


def _release_interval(dimension: _Dimension, low: np.ndarray, high: np.ndarray, sizes: np.ndarray):
    """``[lo-hi]`` per class (``lo`` if the class holds one value); loss width / attribute range."""
    low_text, high_text = _format_numbers(dimension.distinct[low]), _format_numbers(dimension.distinct[high])
    labels = np.where(low == high, low_text, "[" + low_text + "-" + high_text + "]")
    widths = dimension.upper_edge[high] - dimension.lower_edge[low]
    attribute_range = float(dimension.upper_edge[-1] - dimension.lower_edge[0])
    loss = widths / attribute_range if attribute_range > 0 else np.zeros(len(widths))
    summary = {
        "kind": "interval",
        "mean_width": float(np.average(widths, weights=sizes)),
        "max_width": float(widths.max()),
        "records_with_exact_value": int(sizes[low == high].sum()),
    }
    return labels, loss, summary


def _release_set(dimension: _Dimension, classes: _Classes, j: int):
    """The set of a class's values, ``{a,b}`` (``a`` if one value); loss (set size-1)/(distinct-1)."""
    pairs = np.unique(classes.unit_ids * dimension.n_distinct + classes.units.codes[j])
    pair_class, pair_code = np.divmod(pairs, dimension.n_distinct)
    joined = pd.Series(dimension.distinct[pair_code]).groupby(pair_class).agg(",".join).to_numpy(dtype=object)
    set_sizes = np.bincount(pair_class)
    labels = np.where(set_sizes == 1, joined, "{" + joined + "}")
    spread = dimension.n_distinct - 1
    loss = (set_sizes - 1) / spread if spread > 0 else np.zeros(len(set_sizes))
    summary = {
        "kind": "set",
        "mean_set_size": float(np.average(set_sizes, weights=classes.sizes)),
        "max_set_size": int(set_sizes.max()),
    }
    return labels, loss, summary
