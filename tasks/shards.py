"""The partitioned path's histogram in shards, and the anonymiser run on them without one process holding it.

Each intake task splits its piece's histogram of distinct k-quasi tuples by a hash of the tuple into
``buckets`` partial histograms, written to the (sealed) scratch folder. Then, on the cluster:

* **merge** (one task per bucket): the pieces' partials of that bucket added up — a tuple is in one
  bucket only, so each merged **shard** is the whole table's histogram restricted to its tuples. The
  task returns counts and, per k-quasi, the shard's distinct values with their first position and
  records (what hierarchies and the encoding need; bounded by the columns' domains, not by the rows).
* **Mondrian** (``kepsilon.engine.mondrian_tree``): the top of the cut tree from the shards' statistics
  (one task per shard and depth, summed in the flow: counts by node and code), then every leaf's
  tuples gathered from the shards and finished as a task of its own, its classes numbered by a
  reduction over the leaves' first rows, and the classes of every shard's tuples written back, also
  piece by piece (each piece's tuples of the shard, in its partial's order: the distribution's input). The
  per-class figures (report, class partitions, certain linking share) come from one reduction task.
* **OLA** keeps one task (its lattice search needs every tuple): it reads the shards itself, on a
  worker, and writes the classes back the same way.

The flow receives only counts, the tree's cuts, and the hierarchies; a task's inputs are names in the
scratch folder, never the histogram. ``each(name, function, arguments)`` runs ``function(*a)`` for
every ``a`` (a Dask task each in the flow, a plain loop in tests).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kepsilon.engine.anonymise import AnonymisedTuples, hierarchies_from_values
from kepsilon.engine.criteria import criteria_from_value_counts, declared, load_sensitive_hierarchies
from kepsilon.engine.histogram import (
    TupleHistogram,
    concat_disjoint,
    merge_histograms,
    merge_histograms_placing,
    split_tuples,
    take_tuples,
)
from kepsilon.engine.mondrian_tree import (
    CutTree,
    Encoding,
    NodeStatistics,
    SubtreeClasses,
    class_numbers,
    finish_subtree,
    grow_top,
    mondrian_report,
    node_statistics,
)
from kepsilon.engine.ola import ola_classes
from kepsilon.engine.partition import TupleClasses, _check_parameters
from kepsilon.flows.spec import ReleaseSpec

from .scratch import Scratch

# A leaf of the top of the cut tree is finished in one task when it holds at most this many distinct
# tuples (about 0.7 KB each in memory): a worker's share, whatever the table's size.
MAX_SUBTREE_TUPLES = 200_000
# scratch: (bucket) each piece's partial's length, and where its tuples went in the shard (``merge_shard``)
PARTIAL_PLACES = "partial-places"
# scratch: (piece, bucket) the class of each of the piece's tuples in that bucket, in its partial's order
# (``write_piece_classes``): all the distribution reads of the anonymiser's decision
PIECE_CLASSES = "piece-classes"
SHARD_CODES = "shard-codes"  # scratch: (bucket) the shard's tuples' codes and records (``encoded_shard``)

Each = Callable[[str, Callable, list[tuple]], list]
# The cut statistics of a depth of the top come back in at most this many results (each task adds up its shards'):
# they are (open nodes x codes) arrays per k-quasi, and a result per shard made the flow hold 60 of them at 30M
# fine rows, its peak 58 MB above the step before (17.5 % over 1M's). The flow passes its cluster's task count.
STATISTICS_TASKS = 6


def tuple_hashes(tuples: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """A 64-bit hash of each tuple's k-quasi values, the same in every piece."""
    return pd.util.hash_pandas_object(tuples[list(columns)], index=False).to_numpy(dtype=np.uint64)


def tuple_buckets(tuples: pd.DataFrame, columns: list[str], buckets: int, hashes: np.ndarray | None = None) -> np.ndarray:
    """The bucket (0..buckets-1) of each tuple: its hash (``tuple_hashes``, or the ``hashes`` given) modulo the buckets."""
    if buckets == 1 or not len(tuples):
        return np.zeros(len(tuples), dtype=np.int64)
    hashes = tuple_hashes(tuples, columns) if hashes is None else hashes
    return (hashes % np.uint64(buckets)).astype(np.int64)


def write_piece_classes(scratch: Scratch, bucket: int, class_of_tuple: np.ndarray,
                        placed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """The classes of a shard's tuples (``class_of_tuple``, in the shard's order) handed to the pieces: per piece
    with tuples in this bucket, the class of each (``PIECE_CLASSES``), in the order of the piece's partial, read
    where the merge placed them (``placed``: ``PARTIAL_PLACES``, read here when not given). The distribution of a
    piece then reads its own tuples' classes only, bucket by bucket: its work grows with the piece, where looking
    its records' tuples up in every shard grew with the whole table's distinct tuples (pieces × shards' tuples)."""
    lengths, places = scratch.read(PARTIAL_PLACES, bucket) if placed is None else placed
    ends = np.cumsum(lengths)
    for piece, (end, length) in enumerate(zip(ends.tolist(), lengths.tolist())):
        if length:
            scratch.write(class_of_tuple[places[end - length:end]], PIECE_CLASSES, piece, bucket)


def write_partials(scratch: Scratch, histogram: TupleHistogram, columns: list[str], buckets: int, piece: int,
                   hashes: np.ndarray | None = None) -> np.ndarray:
    """Intake's side: the piece's histogram split by bucket, one partial per bucket, into the scratch.
    ``hashes``: its tuples' ``tuple_hashes``, where the caller has them. Returns each tuple's bucket: a partial
    holds its bucket's tuples in the histogram's order (``split_tuples``)."""
    bucket_of_tuple = tuple_buckets(histogram.tuples, columns, buckets, hashes)
    split = {bucket: part for bucket, _, part in split_tuples(histogram, bucket_of_tuple)}
    for number in range(buckets):  # every bucket gets a partial, empty or not (the merge reads them all)
        scratch.write(split[number] if number in split else take_tuples(histogram, np.zeros(0, dtype=np.int64)),
                      "partial", number, piece)
    return bucket_of_tuple


# --------------------------------------------------------------------------- merge


@dataclass
class ShardSummary:
    """What a merged shard tells the flow: its size, and per k-quasi its distinct values (value, first, records)."""

    index: int
    tuples: int
    records: int
    columns: dict[str, pd.DataFrame]


def column_summaries(histogram: TupleHistogram, columns: list[str]) -> dict[str, pd.DataFrame]:
    """Per column: its distinct values among the tuples, the first position and the records of each."""
    result = {}
    for column in columns:
        frame = pd.DataFrame({"value": histogram.tuples[column], "first": histogram.first, "records": histogram.weights})
        result[column] = _reduce_values(frame)
    return result


def _reduce_values(frame: pd.DataFrame) -> pd.DataFrame:
    grouped = frame.groupby("value", sort=False, dropna=False, observed=True)
    reduced = pd.DataFrame({"first": grouped["first"].min(), "records": grouped["records"].sum()})
    values = pd.Series(reduced.index, dtype=frame["value"].dtype)
    return pd.DataFrame({"value": values.to_numpy(), "first": reduced["first"].to_numpy(),
                         "records": reduced["records"].to_numpy()}).astype({"value": frame["value"].dtype})


def add_column_summaries(summaries: list[ShardSummary], columns: list[str]) -> dict[str, pd.DataFrame]:
    """The shards' distinct values per column added up, in order of first occurrence in the table."""
    result = {}
    for column in columns:
        frame = pd.concat([s.columns[column] for s in summaries], ignore_index=True)
        result[column] = _reduce_values(frame).sort_values("first", kind="stable").reset_index(drop=True)
    return result


def merge_shard(scratch: Scratch, bucket: int, offsets: list[int], columns: list[str]) -> ShardSummary:
    """One bucket's partials of every piece added up (first positions shifted to the source's) into a shard;
    where each partial's tuples went in it (``PARTIAL_PLACES``), for :func:`write_piece_classes`."""
    parts = []
    for piece, offset in enumerate(offsets):
        part = scratch.read("partial", bucket, piece)
        part.first = part.first + offset
        parts.append(part)
    merged, places = merge_histograms_placing(parts, columns)
    scratch.write(merged, "shard", bucket)
    scratch.write((np.array([len(part) for part in parts], dtype=np.int64), places), PARTIAL_PLACES, bucket)
    return ShardSummary(bucket, len(merged), merged.records, column_summaries(merged, columns))


# --------------------------------------------------------------------------- what the anonymiser decided


@dataclass
class ShardedClasses:
    """The anonymiser's decision when the classes of the tuples stay in the scratch (``PIECE_CLASSES``)."""

    report: dict
    levels: dict | None
    hierarchies: dict
    criteria: list
    rows_kept: int
    certain_share: float
    n_classes: int

    def anonymised(self) -> AnonymisedTuples:
        """As ``AnonymisedTuples`` (its ``class_of_tuple`` empty: the classes are in the scratch)."""
        classes = TupleClasses(np.zeros(0, dtype=np.int64), pd.DataFrame(), self.report, self.levels)
        return AnonymisedTuples(classes, self.hierarchies, self.criteria)


def hierarchies_of(spec: ReleaseSpec, columns: dict[str, pd.DataFrame]) -> dict:
    """The spec's hierarchies (``anonymise.load_hierarchies``) from each column's distinct values in order of
    first occurrence with their records: what a builder sees of the whole histogram's tuples."""
    return hierarchies_from_values(spec, lambda column: (
        pd.Series(columns[column]["value"], name=column), columns[column]["records"].to_numpy(dtype=np.int64)))


def anonymise_shards(
    spec: ReleaseSpec, scratch: Scratch, summaries: list[ShardSummary], values: dict[str, pd.Series], each: Each,
    max_tuples: int = MAX_SUBTREE_TUPLES, statistics_tasks: int = STATISTICS_TASKS,
) -> ShardedClasses:
    """Mondrian or OLA on the shards (module docstring); ``values``: every sensitive column's value counts;
    ``statistics_tasks``: the tasks a depth's cut statistics are counted in (``STATISTICS_TASKS``)."""
    columns = [q.column for q in spec.roles.k_quasi]
    rows = sum(s.records for s in summaries)
    _check_parameters(pd.Index(columns), rows, columns, spec.k)
    per_column = add_column_summaries(summaries, columns)
    hierarchies = hierarchies_of(spec, per_column)
    criteria = criteria_from_value_counts(spec.roles.sensitive, values, load_sensitive_hierarchies(spec.roles.sensitive))
    buckets = len(summaries)
    if spec.algorithm == "ola":
        (result,) = each("k-anonymise", ola_on_shards, [(scratch, buckets, spec, hierarchies, criteria)])
        report, levels, rows_kept, share, n_classes = result
    else:
        encoding = Encoding.build({c: per_column[c]["value"] for c in columns}, columns, hierarchies)
        report, rows_kept, share, n_classes = _mondrian_on_shards(
            spec, scratch, buckets, encoding, criteria, rows, each, max_tuples, statistics_tasks)
        levels = None
    report["hierarchies"] = {column: h.sha256 for column, h in hierarchies.items()}
    return ShardedClasses(report, levels, hierarchies, criteria, rows_kept, share, n_classes)


def _mondrian_on_shards(spec, scratch, buckets, encoding, criteria, rows, each, max_tuples, statistics_tasks):
    tasks = max(1, statistics_tasks)
    groups = [list(range(first, buckets, tasks)) for first in range(min(tasks, buckets))]  # shards dealt in turn

    def statistics_of(tree: CutTree, nodes: np.ndarray) -> NodeStatistics:
        parts = each("cut-statistics", shard_statistics,
                     [(scratch, group, tree, nodes, encoding, criteria) for group in groups])
        return NodeStatistics.add(parts)

    tree = grow_top(encoding, spec.k, criteria, statistics_of, max_tuples)
    leaves = [int(leaf) for leaf in tree.leaves()]
    each("route", route_shard, [(scratch, b, tree, encoding) for b in range(buckets)])
    e_quasis = [q.column for q in spec.roles.e_quasi]
    each("mondrian-subtree", finish_leaf, [(scratch, leaf, buckets, encoding, spec.k, criteria, e_quasis) for leaf in leaves])
    each("number-classes", number_classes, [(scratch, leaves)])
    each("renumber-leaf", number_leaf, [(scratch, leaf) for leaf in leaves])
    each("collect-classes", collect_shard, [(scratch, b, leaves) for b in range(buckets)])
    (result,) = each("class-report", class_report, [(scratch, leaves, encoding, rows, spec, buckets)])
    return result


# --------------------------------------------------------------------------- Mondrian's tasks


def shard_statistics(scratch: Scratch, buckets: list[int], tree: CutTree, nodes: np.ndarray, encoding: Encoding,
                     criteria) -> NodeStatistics:
    """Some shards' statistics of the open nodes of the top, added up as each is counted (a shard itself is read
    only for a declared criterion's pairs, or by :func:`encoded_shard` to encode it the first time)."""
    total = None
    for bucket in buckets:
        histogram = scratch.read("shard", bucket) if declared(criteria) else None
        codes, weights = encoded_shard(scratch, bucket, encoding, histogram)
        part = node_statistics(tree, nodes, encoding, histogram, criteria, codes=codes, weights=weights)
        total = part if total is None else NodeStatistics.add([total, part])
    assert total is not None, "a task counts at least one shard"
    return total


def encoded_shard(scratch: Scratch, bucket: int, encoding: Encoding, shard: TupleHistogram | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The shard's tuples' codes under the release's encoding, and their records: encoded once per shard (the
    first depth of the top writes them, ``SHARD_CODES``), where every depth and the routing encoded the
    shard's values again (10M fine rows: the cut statistics' worker CPU 5.5 -> 4.2 s, the routing's 1.4 -> 1.1 s)."""
    if scratch.exists(SHARD_CODES, bucket):
        return scratch.read(SHARD_CODES, bucket)
    shard = scratch.read("shard", bucket) if shard is None else shard
    encoded = (encoding.codes(shard.tuples), shard.weights)
    scratch.write(encoded, SHARD_CODES, bucket)
    return encoded


def route_shard(scratch: Scratch, bucket: int, tree: CutTree, encoding: Encoding) -> int:
    """One shard's tuples to the leaves of the top (``leaf``, leaf, bucket: the sub-histogram and the
    tuples' positions in the shard). Returns the leaves it wrote to."""
    shard = scratch.read("shard", bucket)
    codes, _ = encoded_shard(scratch, bucket, encoding, shard)
    parts = split_tuples(shard, tree.leaf_of(codes))
    for leaf, positions, part in parts:
        scratch.write((part, positions), "leaf", leaf, bucket)
    return len(parts)


def finish_leaf(scratch: Scratch, leaf: int, buckets: int, encoding: Encoding, k: int, criteria, e_quasis: list[str]) -> int:
    """One leaf of the top finished in memory: its classes (numbered in the leaf), their first rows and
    figures, and where in each shard its tuples are. Returns its number of classes."""
    parts = [(b, *scratch.read("leaf", leaf, b)) for b in scratch.present("leaf", leaf, count=buckets)]
    histogram = concat_disjoint([part for _, part, _ in parts])
    classes = finish_subtree(histogram, encoding, k, criteria)
    zero = {}
    n = len(classes.sizes)
    for column in e_quasis:
        low, high = histogram.extremes[column]
        class_low, class_high = np.full(n, np.inf), np.full(n, -np.inf)
        np.minimum.at(class_low, classes.class_of_tuple, low)
        np.maximum.at(class_high, classes.class_of_tuple, high)
        zero[column] = (class_high - class_low) == 0
    where = [(b, positions) for b, _, positions in parts]
    scratch.write({"classes": classes, "where": where, "zero": zero}, "local", leaf)
    scratch.write(classes.first_rows, "firsts", leaf)
    return n


def number_classes(scratch: Scratch, leaves: list[int]) -> int:
    """The whole table's class numbers (by first record, over every leaf), one array per leaf: a sort of
    the classes' first rows (8 bytes a class, on one worker)."""
    firsts = [scratch.read("firsts", leaf) for leaf in leaves]
    every = np.sort(np.concatenate(firsts))
    for leaf, first_rows in zip(leaves, firsts):
        scratch.write(class_numbers(first_rows, [every]), "numbers", leaf)
    return len(every)


def number_leaf(scratch: Scratch, leaf: int) -> int:
    """A leaf's classes under their whole-table numbers, written back by shard and into its class table."""
    local = scratch.read("local", leaf)
    classes: SubtreeClasses = local["classes"]
    numbers = scratch.read("numbers", leaf)
    start = 0
    for bucket, positions in local["where"]:
        ids = numbers[classes.class_of_tuple[start:start + len(positions)]]
        scratch.write((positions, ids), "class-of", bucket, leaf)
        start += len(positions)
    scratch.write({"numbers": numbers, "classes": classes, "zero": local["zero"]}, "class-table", leaf)
    return len(numbers)


def collect_shard(scratch: Scratch, bucket: int, leaves: list[int]) -> int:
    """A shard's classes from its leaves, handed to the pieces (:func:`write_piece_classes`) for the distribution
    of the records. Returns the shard's tuples: every one came from some piece's partial, so the places name them
    all, and the shard itself is not read."""
    placed = scratch.read(PARTIAL_PLACES, bucket)
    places = placed[1]
    class_of_tuple = np.full(int(places.max()) + 1 if len(places) else 0, -1, dtype=np.int64)
    for leaf in leaves:
        if scratch.exists("class-of", bucket, leaf):
            positions, ids = scratch.read("class-of", bucket, leaf)
            class_of_tuple[positions] = ids
    write_piece_classes(scratch, bucket, class_of_tuple, placed)
    return len(class_of_tuple)


def class_report(scratch: Scratch, leaves: list[int], encoding: Encoding, rows: int, spec: ReleaseSpec, parts: int):
    """One reduction over every leaf's class table: Mondrian's report, the class partitions (``targets``),
    the records kept and the certain linking share. Returns (report, rows kept, share, classes)."""
    tables = [scratch.read("class-table", leaf) for leaf in leaves]
    n = sum(len(t["numbers"]) for t in tables)
    d = len(encoding.dimensions)
    sizes = np.zeros(n, dtype=np.int64)
    loss = [np.zeros(n) for _ in range(d)]
    low = [np.zeros(n, dtype=np.int64) for _ in range(d)]
    high = [np.zeros(n, dtype=np.int64) for _ in range(d)]
    levels = {j: np.zeros(n, dtype=np.int64) for j, dim in enumerate(encoding.dimensions) if dim.kind == "hierarchy"}
    set_sizes = {j: np.zeros(n, dtype=np.int64) for j, dim in enumerate(encoding.dimensions) if dim.kind == "set"}
    zero = {q.column: np.zeros(n, dtype=bool) for q in spec.roles.e_quasi}
    for table in tables:
        at, classes = table["numbers"], table["classes"]
        sizes[at] = classes.sizes
        for j in range(d):
            loss[j][at], low[j][at], high[j][at] = classes.loss[j], classes.low[j], classes.high[j]
        for j in levels:
            levels[j][at] = classes.levels[j]
        for j in set_sizes:
            set_sizes[j][at] = classes.set_sizes[j]
        for column in zero:
            zero[column][at] = table["zero"][column]
    report = mondrian_report(encoding, rows, spec.k, sizes, loss, low, high, levels, set_sizes)
    scratch.write(_targets(sizes, parts), "targets")
    share = 0.0
    if spec.scale_basis == "diameter" and rows:
        share = max((int(sizes[flags].sum()) / rows for flags in zero.values()), default=0.0)
    return report, rows, share, n


def _targets(sizes: np.ndarray, parts: int) -> np.ndarray:
    """``partitioned.class_targets`` from the classes' sizes in class order."""
    before = np.cumsum(sizes) - sizes
    share = max(sizes.sum() / max(parts, 1), 1.0)
    return np.minimum((before // share).astype(np.int64), parts - 1)


# --------------------------------------------------------------------------- OLA


def ola_on_shards(scratch: Scratch, buckets: int, spec: ReleaseSpec, hierarchies: dict, criteria):
    """OLA in one task (its lattice needs every tuple), reading the shards on the worker. Returns
    (report, levels, rows kept, certain linking share, classes)."""
    from .partitioned import certain_linking_share

    columns = [q.column for q in spec.roles.k_quasi]
    shards = [scratch.read("shard", b) for b in range(buckets)]
    whole = merge_histograms(shards, columns)  # in order of first occurrence: the whole table's histogram
    classes = ola_classes(whole, columns, spec.k, hierarchies, spec.suppression_budget, spec.ola_metric, criteria)
    class_of_tuple = classes.class_of_tuple
    for bucket, shard in enumerate(shards):
        at = np.searchsorted(whole.first, shard.first)  # a tuple's first record is its own
        write_piece_classes(scratch, bucket, class_of_tuple[at])
    kept = class_of_tuple >= 0
    n = int(class_of_tuple.max()) + 1 if kept.any() else 0
    sizes = np.bincount(class_of_tuple[kept], weights=whole.weights[kept], minlength=n).astype(np.int64)
    scratch.write(_targets(sizes, buckets), "targets")
    share = certain_linking_share(whole, class_of_tuple, spec)
    return classes.report, classes.levels, int(whole.weights[kept].sum()), share, n
