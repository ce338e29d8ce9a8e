"""Mondrian on a histogram held in shards: the top of the cut tree from statistics, then sub-trees.

:func:`kepsilon.engine.mondrian.mondrian_classes` needs the whole histogram of distinct k-quasi tuples in
one process. This module computes the **same classes** when the histogram lies in shards that no process
holds together (the Dask engine keeps them in its scratch folder, one shard per range of tuple hashes):

1. **Encoding.** Every dimension's codes (dense ranks in the column's order, ``mondrian._encode``) depend
   only on the set of the column's distinct values, so the shards' distinct values per column, added up,
   encode every shard alike (:class:`Encoding`).
2. **Top of the cut tree.** A Mondrian node is a box of codes (a cut puts ``code ≤ c`` left), and its cut
   depends only on, per dimension, its records by code: the smallest and largest code present (the
   width), the weighted lower median and the ties at it (the cut), and, with declared sensitive
   criteria, the records by (code, sensitive value) (whether both halves meet them). Each shard counts
   these for the open nodes (:func:`node_statistics`); the counts add up; :func:`choose_cuts` applies
   ``mondrian._choose_cuts``' rule to them exactly (same integers, same floating-point widths, same
   tie-breaking: the widest allowed dimension, the first listed among equal widths). :func:`grow_top`
   repeats that, depth by depth, until every open node holds at most ``max_tuples`` distinct tuples
   (or cannot be cut).
3. **Sub-trees.** Each leaf of the top is a box whose tuples (gathered from every shard, a few per
   shard) fit one process; :func:`finish_subtree` runs the in-memory recursion on them
   (``mondrian._split_into_classes``, with the whole table's encoding). Mondrian's choice at a node
   depends on the node's records only, never on its siblings, so the classes are the in-memory ones.
4. **Numbering.** In-memory classes are numbered by their first record. A class's number is the count
   of classes (of every sub-tree) whose first record comes before its own (:func:`class_numbers`), read
   one sub-tree's sorted first rows at a time.

The report (:func:`mondrian_report`) is computed from per-class arrays in class order with the same
numpy calls as the in-memory one, so it is equal too. Nothing here knows about Dask: the caller decides
where the statistics are counted and where each sub-tree runs (``tasks/mondrian_tasks.py``).
"""

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from .criteria import ColumnCriteria, declared
from .errors import SpecError
from .hierarchy import Hierarchy, categorical_precision, lowest_common_levels
from .histogram import TupleHistogram, pair_codes
from .mondrian import ALGORITHM, _Classes, _Dimension, _distinct_tuples, _encode, _SensitiveCounts, _split_into_classes

# --------------------------------------------------------------------------- the encoding


@dataclass(frozen=True)
class Encoding:
    """The whole table's encoding of every k-quasi (``mondrian._Dimension`` without per-tuple codes)."""

    columns: tuple[str, ...]
    dimensions: tuple[_Dimension, ...]

    @classmethod
    def build(cls, distinct: dict[str, pd.Series], columns: list[str], hierarchies: dict[str, Hierarchy]) -> "Encoding":
        """From each column's distinct values over the whole table (any order, the column's dtype)."""
        dimensions = tuple(_encode(distinct[column].rename(column), hierarchies.get(column)) for column in columns)
        return cls(tuple(columns), dimensions)

    def codes(self, tuples: pd.DataFrame) -> np.ndarray:
        """Per dimension, every tuple's code: an int64 array of shape (dimensions, tuples)."""
        result = np.empty((len(self.dimensions), len(tuples)), dtype=np.int64)
        for j, dimension in enumerate(self.dimensions):
            result[j] = _codes_of(dimension, tuples[dimension.name])
        return result

    def with_codes(self, codes: np.ndarray) -> list[_Dimension]:
        """The dimensions holding these tuples' codes (what ``mondrian``'s recursion takes)."""
        return [replace(dimension, codes=codes[j]) for j, dimension in enumerate(self.dimensions)]


def _codes_of(dimension: _Dimension, values: pd.Series) -> np.ndarray:
    """The codes of values under a dimension encoded from the whole table's distinct values."""
    value_codes, distinct_values = pd.factorize(values, use_na_sentinel=False)
    distinct_values = pd.Series(distinct_values, name=values.name, dtype=values.dtype)
    if dimension.hierarchy is not None:  # kind "hierarchy"
        keys = dimension.hierarchy.leaf_codes(distinct_values)
    elif dimension.kind == "interval":
        keys = distinct_values.to_numpy(dtype=dimension.distinct.dtype)
    else:
        keys = distinct_values.astype(str).to_numpy(dtype=object)
    codes = np.searchsorted(dimension.distinct, keys)
    found = (codes < len(dimension.distinct)) & (dimension.distinct[np.minimum(codes, len(dimension.distinct) - 1)] == keys)
    if not np.all(found):
        raise ValueError(f"{dimension.name}: a value is missing from the table's encoding")
    return codes.astype(np.int64)[value_codes]


def distinct_values(tuples: pd.DataFrame, columns: list[str]) -> dict[str, pd.Series]:
    """Each column's distinct values among these tuples (a shard's share of :meth:`Encoding.build`'s input)."""
    return {column: tuples[column].drop_duplicates().reset_index(drop=True) for column in columns}


def add_distinct_values(parts: list[dict[str, pd.Series]]) -> dict[str, pd.Series]:
    """The shards' distinct values added up (distinct over every shard)."""
    columns = parts[0].keys()
    return {c: pd.concat([part[c] for part in parts], ignore_index=True).drop_duplicates().reset_index(drop=True)
            for c in columns}


# --------------------------------------------------------------------------- the cut tree


@dataclass
class CutTree:
    """The top of Mondrian's cut tree: per node, its cut (``dimension`` −1 for a leaf), left if code ≤ ``cut``."""

    dimension: np.ndarray = field(default_factory=lambda: np.array([-1], dtype=np.int64))
    cut: np.ndarray = field(default_factory=lambda: np.array([-1], dtype=np.int64))
    left: np.ndarray = field(default_factory=lambda: np.array([-1], dtype=np.int64))
    right: np.ndarray = field(default_factory=lambda: np.array([-1], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.dimension)

    def leaves(self) -> np.ndarray:
        return np.flatnonzero(self.dimension < 0)

    def split(self, nodes: np.ndarray, dimensions: np.ndarray, cuts: np.ndarray) -> np.ndarray:
        """Cut ``nodes`` (leaves); returns their children, left and right of each node in turn."""
        first = len(self)
        children = first + np.arange(2 * len(nodes), dtype=np.int64)
        self.dimension[nodes], self.cut[nodes] = dimensions, cuts
        self.left[nodes], self.right[nodes] = children[0::2], children[1::2]
        none = np.full(len(children), -1, dtype=np.int64)
        self.dimension = np.concatenate([self.dimension, none])
        self.cut = np.concatenate([self.cut, none])
        self.left = np.concatenate([self.left, none])
        self.right = np.concatenate([self.right, none])
        return children

    def leaf_of(self, codes: np.ndarray) -> np.ndarray:
        """The leaf of every tuple (``codes``: shape (dimensions, tuples)), descending one depth at a time."""
        node = np.zeros(codes.shape[1], dtype=np.int64)
        positions = np.arange(codes.shape[1])
        inner = self.dimension[node] >= 0
        while inner.any():
            at = node[inner]
            value = codes[self.dimension[at], positions[inner]]
            node[inner] = np.where(value <= self.cut[at], self.left[at], self.right[at])
            inner = self.dimension[node] >= 0
        return node


@dataclass
class NodeStatistics:
    """What the cut of each asked node needs, counted over some tuples (one shard's, or all added up).

    ``tuples``: distinct tuples per node; ``records``: per dimension, records by (node, code), shape
    (nodes, codes); ``by_value``: per declared criterion, per dimension, records by (node, code, value).
    """

    tuples: np.ndarray
    records: list[np.ndarray]
    by_value: list[list[np.ndarray]]

    @staticmethod
    def add(parts: list["NodeStatistics"]) -> "NodeStatistics":
        """The statistics of all the parts' tuples, added one part at a time: stacking them first (``np.sum`` of a
        list) copied every part's arrays once more."""
        first = parts[0]

        def total(arrays) -> np.ndarray:
            return functools.reduce(np.add, arrays)

        return NodeStatistics(
            tuples=total([p.tuples for p in parts]),
            records=[total([p.records[j] for p in parts]) for j in range(len(first.records))],
            by_value=[[total([p.by_value[c][j] for p in parts]) for j in range(len(first.records))]
                      for c in range(len(first.by_value))],
        )


def node_statistics(
    tree: CutTree, nodes: np.ndarray, encoding: Encoding, histogram: TupleHistogram | None, criteria: list[ColumnCriteria],
    codes: np.ndarray | None = None, weights: np.ndarray | None = None,
) -> NodeStatistics:
    """The statistics of the leaves ``nodes`` of ``tree`` over one shard of the histogram.

    ``codes`` and ``weights``: the shard's tuples' codes (:meth:`Encoding.codes`) and records when the caller
    has them already; ``histogram`` is then needed only for a declared criterion's (tuple, value) pairs."""
    if codes is None or weights is None:
        if histogram is None:
            raise ValueError("node_statistics needs the histogram, or its codes and weights")
        codes, weights = encoding.codes(histogram.tuples), histogram.weights
    where = np.full(len(tree), -1, dtype=np.int64)
    where[nodes] = np.arange(len(nodes))
    slot = where[tree.leaf_of(codes)]  # −1: a tuple of a leaf not asked about
    inside = slot >= 0
    n = len(nodes)
    records, by_value = [], []
    for j, dimension in enumerate(encoding.dimensions):
        width = dimension.n_distinct
        flat = np.bincount(slot[inside] * width + codes[j][inside], weights=weights[inside], minlength=n * width)
        records.append(np.rint(flat).astype(np.int64).reshape(n, width))
    for criterion in declared(criteria):
        if histogram is None:
            raise ValueError("a declared criterion needs the histogram's (tuple, value) pairs")
        m = len(criterion.domain)
        tuple_of_pair, value, count = pair_codes(histogram, criterion)
        pair_slot = slot[tuple_of_pair]
        keep = pair_slot >= 0
        per_dimension = []
        for j, dimension in enumerate(encoding.dimensions):
            width = dimension.n_distinct
            index = (pair_slot[keep] * width + codes[j][tuple_of_pair[keep]]) * m + value[keep]
            flat = np.bincount(index, weights=count[keep], minlength=n * width * m)
            per_dimension.append(np.rint(flat).astype(np.int64).reshape(n, width, m))
        by_value.append(per_dimension)
    return NodeStatistics(np.bincount(slot[inside], minlength=n).astype(np.int64), records, by_value)


def choose_cuts(
    statistics: NodeStatistics, encoding: Encoding, k: int, criteria: list[ColumnCriteria]
) -> tuple[np.ndarray, np.ndarray]:
    """Per node, Mondrian's cut (``mondrian._choose_cuts``' rule): the dimension (−1: none) and the
    largest code of the left half."""
    enforced = declared(criteria)
    n = len(statistics.tuples)
    best_width = np.full(n, -np.inf)
    best_dimension = np.full(n, -1, dtype=np.int64)
    best_cut = np.full(n, -1, dtype=np.int64)
    for j, dimension in enumerate(encoding.dimensions):
        records = statistics.records[j]
        total = records.sum(axis=1)
        cumulative = np.cumsum(records, axis=1)
        present = records > 0
        low = np.argmax(present, axis=1)
        high = records.shape[1] - 1 - np.argmax(present[:, ::-1], axis=1)
        median = np.argmax(cumulative >= ((total + 1) // 2)[:, None], axis=1)  # the lower median's code
        at_most = cumulative[np.arange(n), median]
        below = at_most - records[np.arange(n), median]
        take_at_most = total - at_most >= k
        take_below = ~take_at_most & (below >= k)
        cut = np.where(take_at_most, median, median - 1)
        allowed = take_at_most | take_below
        width = (dimension.upper_edge[high] - dimension.lower_edge[low]) / dimension.scale
        for criterion, by_value in zip(enforced, statistics.by_value):
            if not allowed.any():
                break
            counts = by_value[j]
            left = np.cumsum(counts, axis=1)[np.arange(n), np.maximum(cut, 0)]
            right = counts.sum(axis=1) - left
            allowed &= criterion.satisfied(left) & criterion.satisfied(right)
        better = allowed & (width > best_width)
        best_width[better] = width[better]
        best_dimension[better] = j
        best_cut[better] = cut[better]
    return best_dimension, best_cut


def grow_top(
    encoding: Encoding,
    k: int,
    criteria: list[ColumnCriteria],
    statistics_of: Callable[[CutTree, np.ndarray], NodeStatistics],
    max_tuples: int,
) -> CutTree:
    """The top of the cut tree: open nodes are cut, depth by depth, while they hold more than
    ``max_tuples`` distinct tuples and a cut is allowed. ``statistics_of(tree, nodes)`` counts the
    statistics of those leaves over the whole histogram (the caller adds the shards' up).

    Refuses, like ``mondrian_classes``, a whole table that fails a declared criterion."""
    tree = CutTree()
    open_nodes = np.array([0], dtype=np.int64)
    while len(open_nodes):
        statistics = statistics_of(tree, open_nodes)
        if len(tree) == 1:
            _check_whole_table(statistics, criteria)
        dimensions, cuts = choose_cuts(statistics, encoding, k, criteria)
        grown = (statistics.tuples > max_tuples) & (dimensions >= 0)
        open_nodes = tree.split(open_nodes[grown], dimensions[grown], cuts[grown])
    return tree


def _check_whole_table(statistics: NodeStatistics, criteria: list[ColumnCriteria]) -> None:
    for criterion, by_value in zip(declared(criteria), statistics.by_value):
        counts = by_value[0].sum(axis=1)  # the root's records by value
        if not criterion.satisfied(counts)[0]:
            raise SpecError(f"roles.sensitive.{criterion.column}", "the whole table does not meet its criteria; no release can")


# --------------------------------------------------------------------------- sub-trees


@dataclass
class SubtreeClasses:
    """The classes of one leaf of the top, numbered 0.. by their first record within the leaf.

    ``class_of_tuple``: per tuple of the leaf's histogram; ``first_rows``: per class, increasing;
    ``sizes``; ``loss``: per dimension, each class's information loss; ``low``/``high``: per dimension,
    each class's smallest and largest code; ``levels``: per hierarchy dimension, each class's lowest
    common level; ``set_sizes``: per set dimension, each class's number of values.
    """

    class_of_tuple: np.ndarray
    first_rows: np.ndarray
    sizes: np.ndarray
    loss: list[np.ndarray]
    low: list[np.ndarray]
    high: list[np.ndarray]
    levels: dict[int, np.ndarray]
    set_sizes: dict[int, np.ndarray]


def finish_subtree(histogram: TupleHistogram, encoding: Encoding, k: int, criteria: list[ColumnCriteria]) -> SubtreeClasses:
    """Mondrian's recursion on the tuples of one leaf of the top (the whole table's encoding)."""
    dimensions = encoding.with_codes(encoding.codes(histogram.tuples))
    units = _distinct_tuples(dimensions, histogram.weights, histogram.first)
    sensitive = _SensitiveCounts.build(declared(criteria), histogram, units)
    classes = _split_into_classes(dimensions, units, k, sensitive)
    loss: list[np.ndarray] = []
    levels: dict[int, np.ndarray] = {}
    set_sizes: dict[int, np.ndarray] = {}
    for j, dimension in enumerate(dimensions):
        class_loss, measure = _class_loss(dimension, classes, j)
        loss.append(class_loss)
        if measure is not None and dimension.kind == "hierarchy":
            levels[j] = measure
        elif measure is not None and dimension.kind == "set":
            set_sizes[j] = measure
    return SubtreeClasses(classes.ids, classes.first_rows, classes.sizes, loss, classes.low_codes, classes.high_codes,
                          levels, set_sizes)


def _class_loss(dimension: _Dimension, classes: _Classes, j: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per class: its information loss on a dimension, and the level (hierarchy) or set size (set) behind it
    (``mondrian._release``' figures)."""
    if dimension.hierarchy is not None:  # kind "hierarchy"
        unit_leaf_codes = dimension.distinct[classes.units.codes[j]]
        levels = lowest_common_levels(unit_leaf_codes, classes.unit_ids, dimension.hierarchy)
        loss = np.broadcast_to(categorical_precision(levels, dimension.hierarchy.height), levels.shape)
        return np.array(loss, dtype=np.float64), levels
    if dimension.kind == "interval":
        widths = dimension.upper_edge[classes.high_codes[j]] - dimension.lower_edge[classes.low_codes[j]]
        attribute_range = float(dimension.upper_edge[-1] - dimension.lower_edge[0])
        return (widths / attribute_range if attribute_range > 0 else np.zeros(len(widths))), None
    pairs = np.unique(classes.unit_ids * dimension.n_distinct + classes.units.codes[j])
    set_sizes = np.bincount(pairs // dimension.n_distinct)
    spread = dimension.n_distinct - 1
    return ((set_sizes - 1) / spread if spread > 0 else np.zeros(len(set_sizes))), set_sizes


def class_numbers(first_rows: np.ndarray, every_subtree: Iterable[np.ndarray]) -> np.ndarray:
    """The whole table's number of each class of a sub-tree (``first_rows``: its classes' first records):
    how many classes, over every sub-tree's sorted ``first_rows`` (its own included), start before it."""
    number = np.zeros(len(first_rows), dtype=np.int64)
    for other in every_subtree:
        number += np.searchsorted(other, first_rows, side="left")
    return number


def mondrian_report(
    encoding: Encoding, rows: int, k: int, sizes: np.ndarray, loss: list[np.ndarray], low: list[np.ndarray],
    high: list[np.ndarray], levels: dict[int, np.ndarray], set_sizes: dict[int, np.ndarray],
) -> dict:
    """``mondrian_classes``' report from per-class arrays in class order (the same numpy calls, same figures)."""
    precision, generalisation = {}, {}
    for j, dimension in enumerate(encoding.dimensions):
        precision[dimension.name] = float(np.average(loss[j], weights=sizes))
        if dimension.hierarchy is not None:  # kind "hierarchy"
            height = dimension.hierarchy.height
            per_level = np.bincount(levels[j], weights=sizes, minlength=height)
            generalisation[dimension.name] = {
                "kind": "hierarchy", "height": height,
                "records_per_level": {str(level): int(count) for level, count in enumerate(per_level)},
                "classes_per_level": {str(level): int(c) for level, c in enumerate(np.bincount(levels[j], minlength=height))},
            }
        elif dimension.kind == "interval":
            widths = dimension.upper_edge[high[j]] - dimension.lower_edge[low[j]]
            generalisation[dimension.name] = {
                "kind": "interval", "mean_width": float(np.average(widths, weights=sizes)),
                "max_width": float(widths.max()), "records_with_exact_value": int(sizes[low[j] == high[j]].sum()),
            }
        else:
            generalisation[dimension.name] = {
                "kind": "set", "mean_set_size": float(np.average(set_sizes[j], weights=sizes)),
                "max_set_size": int(set_sizes[j].max()),
            }
    return {
        "algorithm": ALGORITHM, "k": int(k), "rows": int(rows), "kept_rows": int(rows), "suppressed_rows": 0,
        "n_classes": int(len(sizes)), "smallest_class": int(sizes.min()), "largest_class": int(sizes.max()),
        "mean_class_size": float(sizes.mean()), "precision": precision, "generalisation": generalisation,
        "hierarchies": {d.name: d.hierarchy.sha256 for d in encoding.dimensions if d.hierarchy is not None},
    }
