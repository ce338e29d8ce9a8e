"""OLA: optimal full-domain generalisation of the k-quasis, with a record-suppression budget.

Full-domain generalisation (El Emam et al. 2009, "A globally optimal k-anonymity method for the
de-identification of health data") releases every value of a k-quasi at one level of its hierarchy.
The candidate solutions form a lattice: a node is one level per k-quasi, ``(l_1, ..., l_d)`` with
``0 <= l_c <= h_c - 1``; node B generalises node A when ``B >= A`` component-wise.

Guarantee of the returned :class:`Partition`: every kept record shares its released k-quasi labels
with at least ``k - 1`` other kept records; the records of classes smaller than ``k`` are suppressed
(``kept`` is False), and at most ``floor(suppression_budget * n)`` records are suppressed. Among all
nodes with that property the returned one has the least information loss under the chosen metric
(exact, not heuristic), ties broken by the lowest sum of levels and then the lexicographically
smallest level tuple (in the order of ``columns``). Nothing here is randomised.

Why the search is exact although it groups only a fraction of the nodes:

* k-anonymity with suppression is monotone. Generalising merges classes, so a class of size >= k
  stays inside a class of size >= k and the suppressed set can only shrink. Hence a generalisation
  of a k-anonymous node is k-anonymous, and a specialisation of a node that is not is not either;
  one grouping tags a whole up-set or down-set of the lattice ("predictive tagging").
* Every metric comes with a lower bound per node that never decreases along generalisation:
  ``precision`` is its own bound (it depends on the node only, computed for all nodes in closed
  form); for ``loss`` the loss as if nothing were suppressed (closed form per node); for
  ``discernibility`` the sum over records of max(class size, k) at any grouped specialisation
  (a record's class only grows, a kept class has >= k records, a suppressed record costs n). A node whose bound cannot beat the best
  k-anonymous node found so far is neither tagged nor scored, nor is anything above it.
* ``loss`` and ``discernibility`` charge suppressed records, and un-suppressing records by
  generalising can *lower* them, so they are NOT monotone (example for discernibility: merging a
  suppressed singleton into a kept class of size s changes the cost by 2s + 1 - n < 0 when
  n > 2s + 1). Their optimum need not be a minimal k-anonymous node, so after tagging every
  k-anonymous node that could still win is scored, in increasing order of bound, until no bound can
  beat the best score (branch and bound). ``precision`` strictly increases along generalisation,
  so for it that step ends at once.

Sensitive criteria (ℓ-diversity, t-closeness; ``kepsilon.engine.criteria``): a class that fails one
is suppressed like a class smaller than k, within the same budget, and the optimum is over the nodes
whose suppressed records fit the budget. Monotonicity decides how that optimum is found:

* with no criterion, or only ℓ-distinct ones, the suppressed set still shrinks along generalisation
  (a kept class merged with any other keeps ≥ k records and ≥ ℓ distinct values), so the predictive
  tagging above stays exact;
* with entropy or recursive ℓ-diversity or t-closeness it does not (a diverse class merged with a
  suppressed homogeneous one can fail), so nothing is tagged: every node whose bound can still beat
  the best score is grouped and checked, in increasing (bound, tie rank) order, until none can. The
  bounds stay valid (they do not assume monotone suppression), so the result is the same optimum an
  exhaustive search finds; it only groups more nodes.

Speed: records are reduced to their distinct k-quasi tuples (weighted by count) once — the table's
histogram (``kepsilon.engine.histogram``), which :func:`ola_classes` takes directly (a partitioned table
builds it by a reduction) and :func:`ola` builds from a frame in memory —; a node is
grouped by one mixed-radix integer key over per-level label codes, and a node is grouped from the
classes of its smallest already-grouped specialisation when one is cached ("roll-up"), which holds
far fewer rows than the data.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .criteria import declared, group_value_counts, monotone_under_suppression
from .errors import HierarchyError, SpecError
from .hierarchy import Hierarchy
from .histogram import TupleHistogram, pair_codes, tuple_histogram
from .partition import Partition, TupleClasses, check_anonymiser_parameters, check_histogram_parameters

METRICS = ("precision", "loss", "discernibility", "dm_star")

# Above this many distinct combined keys per grouped row a dense bincount wastes memory; sort instead.
_DENSE_KEYS_PER_ROW = 4
_MAX_RADIX_PRODUCT = 2**62

_UNKNOWN, _ANONYMOUS, _NOT_ANONYMOUS = 0, 1, -1


# --------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------


def ola(
    frame: pd.DataFrame,
    columns: list[str],
    k: int,
    hierarchies: Mapping[str, Hierarchy],
    suppression_budget: float,
    metric: str = "precision",
    criteria: list | None = None,
) -> Partition:
    """k-anonymise ``columns`` of ``frame`` by the optimal full-domain generalisation.

    Parameters: ``columns`` the k-quasis (each needs ``hierarchies[column]``, nested: every label of
    a level lies inside one label of the next level); ``k`` >= 2 and <= number of rows;
    ``suppression_budget`` in [0, 1], the largest fraction of records that may be suppressed
    (at most ``floor(suppression_budget * n)`` records); ``metric`` the information loss to
    minimise, one of:

    * ``"precision"`` (Sweeney's Prec loss, the method's categorical precision):
      ``(1/d) * sum_c l_c / (h_c - 1)`` for a node of levels ``l_c`` on hierarchies of ``h_c``
      levels (a one-level hierarchy contributes 0). It does not depend on the records; suppression
      is bounded by the budget and reported separately.
    * ``"loss"`` (generalised loss metric LM, Iyengar 2002): the mean over records r and k-quasis c
      of ``(leaves(label_c(r)) - 1) / (leaves_c - 1)``, where ``leaves(label)`` counts the hierarchy
      leaves under the released label and ``leaves_c`` all leaves of the hierarchy (0 if it has a
      single leaf). A suppressed record costs 1 in every column.
    * ``"discernibility"`` (Bayardo & Agrawal 2005): ``sum over kept classes |ec|^2 + n * suppressed``.
    * ``"dm_star"`` (DM*, the criterion the method's authors chose their nodes by): ``sum over all
      classes |ec|^2``, the classes suppressed for being smaller than k included at their own size.
      Merging classes only raises it, so it never decreases along generalisation and the optimum is a
      minimal k-anonymous node.

    Returns a ``Partition`` (``kepsilon.engine.partition``): ``class_ids`` dense 0..n_classes-1
    (numbered by the first row of each class) for kept rows and -1 for suppressed rows,
    ``released`` the k-quasi columns as hierarchy labels at the chosen node (suppressed rows hold
    the top-level label: they must not be published), ``kept``, and a JSON-serialisable ``report``
    (chosen ``node`` {column: level}, ``metric``/``metric_value``, ``nodes_in_lattice``,
    ``nodes_evaluated``, suppression and class-size figures).

    ``criteria``: sensitive-column criteria (``kepsilon.engine.criteria.ColumnCriteria``); classes that
    fail a declared one are suppressed too (see the module docstring for how the search stays exact).

    Raises ``SpecError`` for a bad ``columns``/``k``/``suppression_budget``/``metric`` or when no node
    is k-anonymous (and meets the criteria) within the budget, ``InputError`` for a column missing
    from the data, ``HierarchyError`` for a missing, non-nested or non-covering hierarchy. Messages
    name the column or parameter, never a value.
    """
    _check_parameters(frame, columns, k, suppression_budget, metric)
    histogram = tuple_histogram(frame, columns, declared(criteria or []))
    classes = ola_classes(histogram, columns, k, hierarchies, suppression_budget, metric, criteria)
    return classes.partition(frame.index, histogram.tuple_of_record())


def ola_classes(
    histogram: TupleHistogram,
    columns: list[str],
    k: int,
    hierarchies: Mapping[str, Hierarchy],
    suppression_budget: float,
    metric: str = "precision",
    criteria: list | None = None,
) -> TupleClasses:
    """OLA on a table's histogram of distinct k-quasi tuples (``kepsilon.engine.histogram``): the
    class of every tuple (``-1``: suppressed), its labels at the chosen node, the node and the report
    :func:`ola` gives. ``histogram.pairs`` must hold the pairs of every declared criterion. Same
    parameters, optimum and refusals as :func:`ola` on the records the histogram counts."""
    _check_search_parameters(k, suppression_budget, metric)
    check_histogram_parameters(histogram, columns, k)
    ordered_hierarchies = [_hierarchy_for(column, hierarchies) for column in columns]
    leaf_codes = np.column_stack(
        [_leaf_codes(histogram.tuples[column], h) for column, h in zip(columns, ordered_hierarchies)]
    )
    n = histogram.records
    records = _RecordTuples.from_leaf_codes(leaf_codes, histogram.weights)
    lattice = _Lattice(tuple(h.height for h in ordered_hierarchies))
    objective = _Objective.build(metric, lattice, records, ordered_hierarchies)
    enforced = declared(criteria or [])
    sensitive = _SensitivePairs.build(enforced, histogram, records) if enforced else None
    evaluator = _NodeEvaluator(records, ordered_hierarchies, k, objective.record_costs, sensitive)
    search = _OptimalSearch(lattice, evaluator, objective, max_suppressed=math.floor(suppression_budget * n + 1e-9))
    monotone = monotone_under_suppression(enforced)
    if monotone and search.evaluate(lattice.top):
        node, value = search.run()
    elif not monotone and search.run_every_node():
        node, value = search.best()
    else:
        raise SpecError(
            "k",
            f"no generalisation of the k-quasis is {k}-anonymous"
            + (" and meets the sensitive criteria" if enforced else "")
            + f" within suppression_budget {suppression_budget}"
            + (", not even the most general one" if monotone else ""),
        )
    return _materialise(
        histogram,
        columns,
        ordered_hierarchies,
        leaf_codes,
        records,
        evaluator,
        node,
        report_extra={
            "algorithm": "ola",
            "k": int(k),
            "suppression_budget": float(suppression_budget),
            "metric": metric,
            "metric_value": value,
            "nodes_in_lattice": lattice.size,
            "nodes_evaluated": evaluator.nodes_evaluated,
            "search": "predictive tagging" if monotone else "every node that could beat the best (non-monotone criteria)",
        },
    )


# --------------------------------------------------------------------------------------------------
# Validation and encoding
# --------------------------------------------------------------------------------------------------


def _check_parameters(frame: pd.DataFrame, columns, k, suppression_budget, metric) -> None:
    """Refuse bad parameters before touching the data; errors name the parameter or column."""
    check_anonymiser_parameters(frame, columns, k)
    _check_search_parameters(k, suppression_budget, metric)


def _check_search_parameters(k, suppression_budget, metric) -> None:
    """The search's own parameters: the budget and the metric (k is checked with the data)."""
    if (
        isinstance(suppression_budget, bool)
        or not isinstance(suppression_budget, (int, float, np.integer, np.floating))
        or not 0.0 <= float(suppression_budget) <= 1.0  # also refuses NaN
    ):
        raise SpecError("suppression_budget", "must be a number in [0, 1]")
    if metric not in METRICS:
        raise SpecError("metric", f"must be one of {', '.join(METRICS)}")


def _hierarchy_for(column: str, hierarchies: Mapping[str, Hierarchy]) -> Hierarchy:
    """The column's hierarchy, refused unless nested (monotone tagging relies on nesting)."""
    hierarchy = hierarchies.get(column) if isinstance(hierarchies, Mapping) else None
    if hierarchy is None:
        raise HierarchyError(column, "k-quasi has no generalisation hierarchy")
    for level in range(hierarchy.height - 1):
        lower, upper = hierarchy.label_codes[level], hierarchy.label_codes[level + 1]
        pairs = lower * (int(upper.max()) + 1) + upper
        if len(np.unique(pairs)) != len(np.unique(lower)):
            raise HierarchyError(
                column,
                f"hierarchy is not nested: a label of level {level} lies under several labels of level {level + 1}",
            )
    return hierarchy


def _leaf_codes(values: pd.Series, hierarchy: Hierarchy) -> np.ndarray:
    """Leaf code of every value, matching only the distinct values against the hierarchy.

    Same matching rules and errors as ``Hierarchy.leaf_codes`` (which does the matching), but the
    string work is done once per distinct value instead of once per record.
    """
    codes, distinct = pd.factorize(values, use_na_sentinel=True)
    if (codes < 0).any():
        raise HierarchyError(hierarchy.column, "has missing values, which are not leaves of its hierarchy")
    return hierarchy.leaf_codes(pd.Series(distinct))[codes]


# --------------------------------------------------------------------------------------------------
# Grouping nodes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RecordTuples:
    """The distinct k-quasi leaf tuples of the data and how many records hold each.

    Grouping the distinct tuples weighted by their counts gives the same classes as grouping the
    records, on fewer rows.
    """

    leaves: np.ndarray  # (m, d) leaf codes, one row per distinct tuple
    counts: np.ndarray  # (m,) records per tuple
    tuple_of_record: np.ndarray  # index of the tuple of each histogram row

    @classmethod
    def from_leaf_codes(cls, leaf_codes: np.ndarray, weights: np.ndarray) -> "_RecordTuples":
        """From the leaf codes of a histogram's rows and their record counts (rows with equal codes merge)."""
        columns = [leaf_codes[:, c] for c in range(leaf_codes.shape[1])]
        key, _ = _combine(columns, [int(column.max()) + 1 for column in columns])
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
        counts = np.bincount(inverse, weights=weights, minlength=len(first)).astype(np.int64)
        return cls(leaves=leaf_codes[first], counts=counts, tuple_of_record=inverse)


def _combine(codes: list[np.ndarray], radices: list[int]) -> tuple[np.ndarray, int]:
    """One int64 key per row from several integer codes (mixed radix), and the key's range.

    Keys are equal exactly when all codes are; when the radix product would overflow int64 the
    partial key is first re-coded densely so the product stays representable.
    """
    key = codes[0].astype(np.int64, copy=True)
    size = radices[0]
    for code, radix in zip(codes[1:], radices[1:]):
        if radix == 1:
            continue
        if size * radix >= _MAX_RADIX_PRODUCT:
            _, key = np.unique(key, return_inverse=True)
            key = key.ravel().astype(np.int64)
            size = int(key.max()) + 1
        key *= radix
        key += code
        size *= radix
    return key, size


@dataclass(frozen=True)
class _Classes:
    """The equivalence classes of a node: one representative tuple and the record count per class.

    All tuples of a class share their labels at the node's levels and, hierarchies being nested,
    at every more general level, so a representative is enough to group the class again at any
    generalisation of the node ("roll-up").
    """

    representative: np.ndarray  # index into _RecordTuples of one tuple of each class
    sizes: np.ndarray  # records per class


def _group(
    codes: list[np.ndarray], radices: list[int], source: _Classes
) -> tuple[np.ndarray, _Classes]:
    """Group the rows of ``source`` on their combined ``codes`` (one code array per column, per row
    of ``source``); returns the new class of every source row and the new classes."""
    key, size = _combine(codes, radices)
    if size <= _DENSE_KEYS_PER_ROW * len(key):
        sizes = np.bincount(key, weights=source.sizes, minlength=size)
        present = sizes > 0
        representative = np.empty(size, dtype=np.int64)
        representative[key] = source.representative
        class_of_cell = np.cumsum(present) - 1
        return class_of_cell[key], _Classes(representative[present], sizes[present].astype(np.int64))
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    sizes = np.bincount(inverse, weights=source.sizes).astype(np.int64)
    return inverse, _Classes(source.representative[first], sizes)


@dataclass(frozen=True)
class _NodeStats:
    suppressed: int  # records in classes smaller than k
    kept_classes: int
    kept_sum_of_squares: int  # sum over kept classes of |ec|^2
    all_sum_of_squares: int  # sum over every class of |ec|^2, suppressed ones included (DM*)
    discernibility_floor: int  # sum over records of max(class size, k): bounds every generalisation
    suppressed_cost_excess: float  # sum over suppressed records of (1 - generalised cost), all columns


class _RollupCache:
    """Classes of recently grouped nodes, to group a new node from its smallest cached specialisation.

    Bounded by the total number of cached classes and by a number of slots; the oldest entries are
    dropped first.
    """

    _EMPTY = np.iinfo(np.int64).max

    def __init__(self, dimensions: int, max_classes: int = 1 << 21, slots: int = 4096):
        self.max_classes = max_classes
        self.nodes = np.zeros((slots, dimensions), dtype=np.int64)
        self.class_counts = np.full(slots, self._EMPTY, dtype=np.int64)
        self.entries: dict[int, _Classes] = {}  # slot -> classes, in insertion order
        self.free_slots: list[int] = []
        self.used = 0  # slots[:used] have been filled at least once
        self.total = 0

    def add(self, node: tuple[int, ...], classes: _Classes) -> None:
        size = len(classes.sizes)
        if size > self.max_classes:
            return
        while self.entries and (
            self.total + size > self.max_classes or (not self.free_slots and self.used == len(self.class_counts))
        ):
            self._drop(next(iter(self.entries)))
        if self.free_slots:
            slot = self.free_slots.pop()
        else:
            slot, self.used = self.used, self.used + 1
        self.nodes[slot] = node
        self.class_counts[slot] = size
        self.entries[slot] = classes
        self.total += size

    def _drop(self, slot: int) -> None:
        self.total -= len(self.entries.pop(slot).sizes)
        self.class_counts[slot] = self._EMPTY
        self.free_slots.append(slot)

    def smallest_specialisation(self, node: tuple[int, ...]) -> _Classes | None:
        """The cached classes of a node <= ``node`` with the fewest classes, if any."""
        if not self.entries:
            return None
        below = (self.nodes[: self.used] <= np.asarray(node)).all(axis=1)
        counts = np.where(below, self.class_counts[: self.used], self._EMPTY)
        slot = int(np.argmin(counts))
        return self.entries[slot] if counts[slot] != self._EMPTY else None


class _NodeEvaluator:
    """Groups the records at lattice nodes and caches what each grouping tells."""

    def __init__(self, records: _RecordTuples, hierarchies: list[Hierarchy], k: int, record_costs=None, sensitive=None):
        self.records = records
        self.k = k
        self.sensitive = sensitive  # _SensitivePairs, or None: only size decides suppression
        self.record_costs = record_costs  # record_costs[c][level]: per tuple, or None if not needed
        # codes[c][level]: label code at that level of every distinct tuple's value in column c.
        self.codes = [
            [h.label_codes[level][records.leaves[:, c]] for level in range(h.height)]
            for c, h in enumerate(hierarchies)
        ]
        self.radices = [[int(h.label_codes[level].max()) + 1 for level in range(h.height)] for h in hierarchies]
        self.all_tuples = _Classes(np.arange(len(records.counts)), records.counts)
        self._stats: dict[tuple[int, ...], _NodeStats] = {}
        self._rollup = _RollupCache(len(hierarchies))

    @property
    def nodes_evaluated(self) -> int:
        """Distinct nodes grouped so far."""
        return len(self._stats)

    def group(self, node: tuple[int, ...], source: _Classes) -> tuple[np.ndarray, _Classes]:
        """Classes at ``node`` of the rows of ``source`` (which must be a specialisation of it)."""
        return _group(
            [self.codes[c][level][source.representative] for c, level in enumerate(node)],
            [self.radices[c][level] for c, level in enumerate(node)],
            source,
        )

    def stats(self, node: tuple[int, ...]) -> _NodeStats:
        """Suppression and class-size statistics of ``node``, grouped once then cached."""
        cached = self._stats.get(node)
        if cached is not None:
            return cached
        if self.sensitive is None:
            source = self._rollup.smallest_specialisation(node) or self.all_tuples
            _, classes = self.group(node, source)
            self._rollup.add(node, classes)
            small = classes.sizes < self.k
        else:  # the criteria count sensitive values per class, so group every tuple
            _, classes, small = self.suppressed_classes(node)
        sizes = classes.sizes
        squares = sizes * sizes
        excess = 0.0
        if self.record_costs is not None and small.any():
            representative = classes.representative[small]
            per_record = sum(1.0 - self.record_costs[c][level][representative] for c, level in enumerate(node))
            excess = float((per_record * sizes[small]).sum())
        stats = _NodeStats(
            suppressed=int(sizes[small].sum()),
            kept_classes=int(np.count_nonzero(~small)),
            kept_sum_of_squares=int(squares[~small].sum()),
            all_sum_of_squares=int(squares.sum()),
            discernibility_floor=int((sizes * np.maximum(sizes, self.k)).sum()),
            suppressed_cost_excess=excess,
        )
        self._stats[node] = stats
        return stats


    def suppressed_classes(self, node: tuple[int, ...]) -> tuple[np.ndarray, _Classes, np.ndarray]:
        """Class of every distinct tuple at ``node``, the classes, and which classes are suppressed:
        smaller than k, or failing a declared sensitive criterion."""
        class_of_tuple, classes = self.group(node, self.all_tuples)
        suppressed = classes.sizes < self.k
        if self.sensitive is not None:
            suppressed |= ~self.sensitive.satisfied(class_of_tuple, len(classes.sizes))
        return class_of_tuple, classes, suppressed


@dataclass(frozen=True)
class _SensitivePairs:
    """Per declared sensitive column: the (distinct k-quasi tuple, sensitive value) pairs and their
    record counts, so a node's per-class value counts are one bincount over the pairs."""

    criteria: list
    pairs: list  # per column: (tuple of pair, value code of pair, records of pair)

    @classmethod
    def build(cls, criteria: list, histogram: TupleHistogram, records: _RecordTuples) -> "_SensitivePairs":
        pairs = []
        for criterion in criteria:
            m = len(criterion.domain)
            row, code, count = pair_codes(histogram, criterion)
            unique, inverse = np.unique(records.tuple_of_record[row].astype(np.int64) * m + code, return_inverse=True)
            counts = np.bincount(inverse.reshape(-1), weights=count, minlength=len(unique)).astype(np.int64)
            pairs.append((unique // m, unique % m, counts))
        return cls(criteria, pairs)

    def satisfied(self, class_of_tuple: np.ndarray, n_classes: int) -> np.ndarray:
        """Whether each class meets every declared criterion."""
        ok = np.ones(n_classes, dtype=bool)
        for criterion, (tuple_of_pair, value, count) in zip(self.criteria, self.pairs):
            counts = group_value_counts(class_of_tuple[tuple_of_pair], value, n_classes, len(criterion.domain), count)
            ok &= criterion.satisfied(counts)
        return ok


# --------------------------------------------------------------------------------------------------
# The lattice, the objective and the search
# --------------------------------------------------------------------------------------------------


class _Lattice:
    """All nodes of the generalisation lattice as an nd-array index space of shape (h_1, ..., h_d)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.size = int(np.prod(shape))
        self.top = tuple(height - 1 for height in shape)
        levels = np.indices(shape).reshape(len(shape), -1)  # (d, size), row-major = lexicographic
        # tie_rank[node]: position in the tie-break order (sum of levels, then lexicographic).
        order = np.lexsort(tuple(levels[::-1]) + (levels.sum(axis=0),))
        rank = np.empty(self.size, dtype=np.int64)
        rank[order] = np.arange(self.size)
        self.tie_rank = rank.reshape(shape)
        self.bottom_up = [tuple(node) for node in levels.T[order].tolist()]
        # Chains grow through the least generalised column (relative level), keeping them central.
        self.relative_level = [
            [level / (height - 1) if height > 1 else 0.0 for level in range(height)] for height in shape
        ]

    @staticmethod
    def generalisations(node: tuple[int, ...]) -> tuple[slice, ...]:
        """Index of the up-set of ``node`` (the node and everything that generalises it)."""
        return tuple(slice(level, None) for level in node)

    @staticmethod
    def specialisations(node: tuple[int, ...]) -> tuple[slice, ...]:
        """Index of the down-set of ``node``."""
        return tuple(slice(0, level + 1) for level in node)


@dataclass
class _Objective:
    """The metric to minimise: a monotone lower bound per node and the exact score of a grouped node.

    ``bound[node] <= score(node)`` always, and the bound never decreases along generalisation, so a
    node whose bound cannot beat the best score found needs neither tagging nor scoring.
    """

    metric: str
    bound: np.ndarray
    n: int
    dimensions: int
    record_costs: list | None = None

    @classmethod
    def build(cls, metric: str, lattice: _Lattice, records: _RecordTuples, hierarchies: list[Hierarchy]):
        n, d = int(records.counts.sum()), len(hierarchies)
        if metric == "precision":
            return cls(metric, _precision_per_node(lattice.shape), n, d)
        if metric == "loss":
            costs = _generalised_costs(records, hierarchies)
            return cls(metric, _loss_without_suppression(costs, records, lattice.shape), n, d, costs)
        if metric == "dm_star":
            # The bottom node's DM* bounds every node (generalising only merges classes); learn() raises it.
            bottom = int((records.counts * records.counts).sum())
            return cls(metric, np.full(lattice.shape, bottom, dtype=np.int64), n, d)
        # Discernibility: the bound starts at 0 and rises as nodes are grouped (see learn).
        return cls(metric, np.zeros(lattice.shape, dtype=np.int64), n, d)

    def score(self, node: tuple[int, ...], stats: _NodeStats):
        """The metric of a grouped node. For loss, the excess of suppression is added to the bound
        itself so that score >= bound holds exactly in floating point."""
        if self.metric == "precision":
            return float(self.bound[node])
        if self.metric == "loss":
            return float(self.bound[node]) + stats.suppressed_cost_excess / (self.n * self.dimensions)
        if self.metric == "dm_star":
            return stats.all_sum_of_squares
        return stats.kept_sum_of_squares + self.n * stats.suppressed

    def learn(self, node: tuple[int, ...], stats: _NodeStats) -> None:
        """Tighten the bound with a grouped node M: for discernibility, every generalisation N of M has
        ``DM(N) >= sum over records r of max(|ec_M(r)|, k)``, because r's class in N contains its
        class in M and is kept only if it has >= k records, and a suppressed record costs n >= both."""
        if self.metric in ("discernibility", "dm_star"):
            floor = stats.discernibility_floor if self.metric == "discernibility" else stats.all_sum_of_squares
            up = _Lattice.generalisations(node)
            np.maximum(self.bound[up], floor, out=self.bound[up])

    def value(self, score) -> int | float:
        return int(score) if self.metric in ("discernibility", "dm_star") else float(score)


def _precision_per_node(shape: tuple[int, ...]) -> np.ndarray:
    """Prec loss of every node: mean over columns of level / (h - 1)."""
    total = np.zeros(shape, dtype=np.float64)
    for c, height in enumerate(shape):
        if height > 1:
            per_level = np.arange(height) / (height - 1)
            total = total + per_level.reshape([-1 if i == c else 1 for i in range(len(shape))])
    return total / len(shape)


def _generalised_costs(records: _RecordTuples, hierarchies: list[Hierarchy]) -> list[list[np.ndarray]]:
    """costs[c][level][t]: (leaves under the label of tuple t's value - 1) / (leaves - 1)."""
    costs = []
    for c, h in enumerate(hierarchies):
        leaves = len(h.leaves)
        per_level = []
        for level in range(h.height):
            under = np.bincount(h.label_codes[level])[h.label_codes[level]]  # leaves under each leaf's label
            per_leaf = (under - 1) / (leaves - 1) if leaves > 1 else np.zeros(leaves)
            per_level.append(per_leaf[records.leaves[:, c]])
        costs.append(per_level)
    return costs


def _loss_without_suppression(costs, records: _RecordTuples, shape: tuple[int, ...]) -> np.ndarray:
    """LM of every node as if no record were suppressed: a lower bound of LM, monotone because a
    label's leaf count grows with its level."""
    d = len(shape)
    total = np.zeros(shape, dtype=np.float64)
    for c, per_level in enumerate(costs):
        column_total = np.array([float((cost * records.counts).sum()) for cost in per_level])
        total = total + column_total.reshape([-1 if i == c else 1 for i in range(d)])
    return total / (int(records.counts.sum()) * d)


class _OptimalSearch:
    """Finds the k-anonymous node of least (score, tie rank), grouping as few nodes as it can.

    Phase 1 (predictive tagging): visits nodes bottom-up; from each untagged node that could still
    beat the best score it walks a chain of untagged generalisations and binary-searches it for the
    k-anonymity boundary (chains as in OLA/Flash). Every grouped node tags its whole up-set
    (k-anonymous) or down-set (not), exact because k-anonymity with suppression is monotone; every
    k-anonymous grouped node is scored. Afterwards every node whose bound beats the best score is
    tagged. Phase 2 (branch and bound): scores the remaining tagged k-anonymous nodes in increasing
    bound order until no bound can beat the best score.
    """

    def __init__(self, lattice: _Lattice, evaluator: _NodeEvaluator, objective: _Objective, max_suppressed: int):
        self.lattice = lattice
        self.evaluator = evaluator
        self.objective = objective
        self.max_suppressed = max_suppressed
        self.status = np.zeros(lattice.shape, dtype=np.int8)
        self.scored = np.zeros(lattice.shape, dtype=bool)
        self.best_node: tuple[int, ...] | None = None
        self.best_key: tuple | None = None

    def run(self) -> tuple[tuple[int, ...], int | float]:
        """The optimal node and its metric value (call after ``evaluate(top)`` returned True)."""
        self._tag_promising_nodes()
        self._score_remaining_candidates()
        return self.best()

    def best(self) -> tuple[tuple[int, ...], int | float]:
        """The best node scored so far and its metric value."""
        if self.best_node is None or self.best_key is None:
            raise ValueError("the search scored no node")
        return self.best_node, self.objective.value(self.best_key[0])

    def run_every_node(self) -> bool:
        """Search without tagging, for non-monotone criteria: group every node in increasing (bound,
        tie rank) order while its bound can still beat the best score; score those within the budget.

        Exact: a node left out has a bound, hence a score, no better than the best found, and the
        bounds (precision: the score itself; loss: loss without suppression; discernibility: raised by
        ``learn``, valid whichever classes are suppressed) never assume monotone suppression. Returns
        whether any node qualified.
        """
        bound, rank = self.objective.bound, self.lattice.tie_rank
        grouped = np.zeros(self.lattice.shape, dtype=bool)
        while not grouped.all():
            open_bounds = np.where(grouped, np.inf, bound.astype(np.float64))
            lowest = open_bounds.min()
            ties = np.flatnonzero((~grouped & (open_bounds == lowest)).ravel())
            flat = ties[np.argmin(rank.ravel()[ties])]
            node = tuple(int(x) for x in np.unravel_index(flat, self.lattice.shape))
            if not self._may_beat_best(node):
                break
            grouped[node] = True
            stats = self.evaluator.stats(node)
            self.objective.learn(node, stats)
            if stats.suppressed <= self.max_suppressed:
                self._score(node, stats)
        return self.best_node is not None

    def evaluate(self, node: tuple[int, ...]) -> bool:
        """Group ``node``; tag its up-set or down-set; score it if k-anonymous."""
        stats = self.evaluator.stats(node)
        self.objective.learn(node, stats)
        if stats.suppressed > self.max_suppressed:
            self.status[self.lattice.specialisations(node)] = _NOT_ANONYMOUS
            return False
        self.status[self.lattice.generalisations(node)] = _ANONYMOUS
        self._score(node, stats)
        return True

    def _score(self, node: tuple[int, ...], stats: _NodeStats) -> None:
        key = (self.objective.score(node, stats), int(self.lattice.tie_rank[node]))
        self.scored[node] = True
        if self.best_key is None or key < self.best_key:
            self.best_node, self.best_key = node, key

    def _may_beat_best(self, node: tuple[int, ...]) -> bool:
        return self.best_key is None or (self.objective.bound[node], self.lattice.tie_rank[node]) < self.best_key

    def _tag_promising_nodes(self) -> None:
        status = self.status
        for start in self.lattice.bottom_up:
            if status[start] != _UNKNOWN or not self._may_beat_best(start):
                continue
            chain = self._untagged_chain(start)
            low, high = 0, len(chain)  # chain[:low] is not k-anonymous, chain[high:] is
            while low < high:
                middle = (low + high) // 2
                node = chain[middle]
                if status[node] == _UNKNOWN:
                    self.evaluate(node)
                if status[node] == _ANONYMOUS:
                    high = middle
                else:
                    low = middle + 1

    def _untagged_chain(self, start: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Untagged nodes from ``start`` upwards, each generalising the least generalised column."""
        shape, relative, status = self.lattice.shape, self.lattice.relative_level, self.status
        chain = [start]
        node = start
        while True:
            step = None
            for c, level in enumerate(node):
                if level + 1 < shape[c]:
                    successor = node[:c] + (level + 1,) + node[c + 1:]
                    if status[successor] == _UNKNOWN and (step is None or relative[c][level + 1] < step[0]):
                        step = (relative[c][level + 1], successor)
            if step is None:
                return chain
            node = step[1]
            chain.append(node)

    def _score_remaining_candidates(self) -> None:
        bound, rank = self.objective.bound, self.lattice.tie_rank
        while True:
            open_nodes = (self.status == _ANONYMOUS) & ~self.scored
            if not open_nodes.any():
                return
            lowest = bound[open_nodes].min()
            ties = np.flatnonzero((open_nodes & (bound == lowest)).ravel())
            flat = ties[np.argmin(rank.ravel()[ties])]
            node = tuple(int(x) for x in np.unravel_index(flat, self.lattice.shape))
            if not self._may_beat_best(node):
                return
            stats = self.evaluator.stats(node)
            self.objective.learn(node, stats)
            self._score(node, stats)


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _materialise(histogram, columns, hierarchies, leaf_codes, records, evaluator, node, report_extra) -> TupleClasses:
    """The classes of the histogram's tuples at ``node``: dense class ids (``-1``: suppressed), labels, report.

    Class ids are numbered by the first record of each class, as Mondrian numbers them.
    """

    class_of_tuple, classes, suppressed = evaluator.suppressed_classes(node)
    raw_class = class_of_tuple[records.tuple_of_record]
    kept = ~suppressed[raw_class]
    class_ids = np.full(len(raw_class), -1, dtype=np.int64)
    if kept.any():
        present, inverse = np.unique(raw_class[kept], return_inverse=True)
        first = np.full(len(present), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, inverse.ravel(), histogram.first[kept])
        dense_of_unique = np.empty(len(present), dtype=np.int64)
        dense_of_unique[np.argsort(first)] = np.arange(len(present))
        class_ids[kept] = dense_of_unique[inverse.ravel()]
    released = pd.DataFrame(
        {
            column: _released_labels(h, level, leaf_codes[:, c], kept)
            for c, (column, h, level) in enumerate(zip(columns, hierarchies, node))
        }
    )
    class_sizes = np.bincount(class_ids[kept], weights=histogram.weights[kept]).astype(np.int64)
    n = histogram.records
    kept_rows = int(histogram.weights[kept].sum())
    report = {
        **report_extra,
        "rows": n,
        "kept_rows": kept_rows,
        "suppressed_rows": n - kept_rows,
        "suppressed_fraction": (n - kept_rows) / n,
        "node": {column: int(level) for column, level in zip(columns, node)},
        "n_classes": int(len(class_sizes)),
        "smallest_class": int(class_sizes.min()) if kept_rows else 0,
        "largest_class": int(class_sizes.max()) if kept_rows else 0,
        "mean_class_size": float(class_sizes.mean()) if kept_rows else 0.0,
        "precision": {
            column: (level / (h.height - 1) if h.height > 1 else 0.0)
            for column, h, level in zip(columns, hierarchies, node)
        },
    }
    levels = {column: int(level) for column, level in zip(columns, node)}
    return TupleClasses(class_of_tuple=class_ids, released=released, report=report, levels=levels)


def _released_labels(hierarchy: Hierarchy, level: int, leaf_codes: np.ndarray, kept: np.ndarray):
    """Labels at ``level`` for kept rows and the most general label for suppressed rows, as strings.

    Suppressed rows still get a label so the frame is complete, but never one of a small class:
    nothing identifying stays in memory for a careless publisher; they must be dropped by ``kept``.
    Built by one take from the per-leaf label table, not by converting a string per record.
    """
    table = pd.array(np.concatenate([hierarchy.labels[level], hierarchy.labels[hierarchy.height - 1]]), dtype="str")
    rows = leaf_codes + np.where(kept, 0, len(hierarchy.leaves))
    return table.take(rows)
