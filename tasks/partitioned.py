"""The partitioned (Dask) release path, stage by stage: what one task does to one partition, and the reductions.

``flows/release_dask.py`` runs each of these stages as one Prefect task in the flow's process, which sends
its partitions to the cluster as plain Dask tasks, a few per worker thread, each doing its share of the
stage's partitions one after the other (``run_batch``):

A. **intake** (per piece of the source, ``tasks/sources.py``): read the piece, classify it with
   ``classify_findings`` (counts of everything ``classify`` refuses), count its histogram of distinct
   k-quasi tuples (``kepsilon.engine.histogram``); the classified records go to the scratch folder, and
   so does the histogram, split by a hash of the tuple into one partial per bucket. The flow adds the
   counts up and refuses what the in-memory path refuses. The partials are then merged into shards and
   anonymised on the cluster (``tasks/shards.py``: Mondrian distributed, OLA in one task), so no
   histogram ever reaches the flow's process.
B. **distribute** (per piece): each record gets its tuple's class (its piece's tuples' classes, read back
   bucket by bucket as each shard's step wrote them: ``piece_classes``) and goes to the class partition of its class: a class
   partition holds whole classes, in ranges of class ids of about equal record counts. Its ε-quasi values
   also go apart, for the prediction before ε (per class partition), which reads nothing else.
C. **perturb and suppress** (per class partition): the engine's stage sequence on whole classes
   (``kepsilon.engine.stages.noise_and_suppress``: noise keyed by (seed, source position, column),
   confidence suppression), then labels from the published members — then the candidate records go
   to the range of their release-order key (the 64-bit key of ``RecordStreams.order_keys``; its ranges
   split the published order into equal parts). It counts, per published group, its size and sensitive
   value counts (``GroupCounts``) and, per class, its counts and errors (``ClassPartition.classes``); the
   flow's task (``tasks/group_reduction.py``) moves both to the scratch — the groups by bucket of group
   keys, since a group can span class partitions — so the flow receives the perturbation and suppression
   counts, the error sums and the error figure's extremes only. Per bucket, the groups are then added up
   and those failing a declared criterion found (diversity suppression); per class partition, its classes
   reduced to the outcome figures (``class_outcome``: sizes as a frequency of frequencies, counts).
D. **publish** (per order-key range): drop the records of groups that fail a declared criterion (their
   keys read from the scratch), sort by (order key, source position) — the in-memory path's published
   order — and write the range as one Parquet file of the dataset (and its CSV records); the gate's column
   checks run on it (Great Expectations), and its groups are counted again from the rows written, then
   added up per bucket of keys, where the gate's group checks run (Great Expectations, on the worker) and
   the disclosure figures are taken (``tasks/group_reduction.py``).

Everything between stages goes through the scratch folder (``Scratch``, ``tasks/scratch.py``), never
through Prefect or the task results: results are counts whose size does not grow with the records, groups
or classes, a piece holds records (``combine_outcome``, ``failing_groups`` and ``GroupCounts.add`` over
all partitions are the whole-table references the tests compare the reductions with). The scratch holds private
data: it lies outside the output folder, its folders are 0700 and its files 0600, every piece is sealed
with a key the run holds in memory only, and the flow removes it when the run ends (a killed run's
leftovers are unreadable, and the next release of any id removes them). Task results hold no data value
either: counts, codes and hashes.

Every partition task can run again (the flow's retry, or Dask re-running the task of a worker that died):
it reads inputs nobody removed yet and replaces its outputs under their final names.
"""

import os
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from kepsilon.engine.anonymise import AnonymisedTuples, histogram_of, k_anonymise_histogram
from kepsilon.engine.assemble import merge_release_columns
from kepsilon.engine.criteria import MISSING, declared, domain_codes, group_value_counts
from kepsilon.engine.histogram import TupleHistogram, _add_counts
from kepsilon.engine.metrics import errors_by_class, linked_records, release_expected_errors
from kepsilon.engine.partition import label_table, published_label_codes, relabel_after_suppression
from kepsilon.engine.perturb import source_positions
from kepsilon.engine.predict import Prediction, predict
from kepsilon.engine.randomness import RecordStreams
from kepsilon.engine.sorting import key_then_position_order, unique_inverse
from kepsilon.engine.stages import noise_and_suppress
from kepsilon.faults import fault_point
from kepsilon.flows.spec import ReleaseSpec
from kepsilon.record import ReleaseMetrics

from .certificate_dask import (
    PART_SKETCH,
    PREDICTED_SKETCH,
    SOURCE_SKETCH,
    part_sketch,
    predicted_sketch,
    source_columns,
    source_sketch,
)
from .classify import NEAR_UNIQUE_MIN_ROWS, NEAR_UNIQUE_RATIO, Findings, classify_findings, refuse_findings
from .counting import by_target
from .errors import InputError, KepsilonError, SpecError
from .figure_inputs import ErrorCells, ErrorExtremes, Extent, FigureInputs, SizeCounts, shown_errors
from .ingest import refuse_short_records
from .publish import csv_records, parquet_bytes
from .scratch import Scratch
from .sources import Piece, SourcePlan, read_piece
from .text_codes import concat_encoded, concat_shuffled, decode_text, encode_text, known_text_codes, per_distinct, text_dtype

DATASET = "data.parquet"  # the published Parquet dataset: a folder of parts, in the published order
DATA_CSV = "data.csv"


# --------------------------------------------------------------------------- scratch
#
# ``Scratch`` (tasks/scratch.py): the run's private, sealed folder. Every task below gets it as an input
# and reads and writes pieces through it; a task never removes its inputs (the flow removes a stage's
# folder once every partition of the stage is done), so a retried task finds them again and overwrites
# its own outputs.


# --------------------------------------------------------------------------- A. intake


@dataclass
class Intake:
    """What a piece of the source tells the flow: counts only (its records and its histogram went to the scratch)."""

    index: int
    rows: int
    findings: Findings
    short: list  # file line numbers of records with fewer fields than the header (CSV)
    values: dict | None  # per sensitive column, records per value; None when its ε-quasis could not be read as numbers


def intake(plan: SourcePlan, piece: Piece, spec: ReleaseSpec, scratch: Scratch) -> Intake:
    """Stage A on one piece: read, classify (counting), histogram; classified records (with each record's tuple,
    numbered as in the histogram, and each tuple's bucket) and the histogram, split into one partial per bucket
    of tuple hashes (``tasks/shards.py``), to the scratch.

    The histogram's first positions are the piece's own (from 0): the merge shifts them by the piece's
    offset once every piece's length is known.
    """
    from .shards import tuple_hashes, write_partials

    frame, short = read_piece(plan, piece, spec.source)
    codes: dict[str, np.ndarray] = {}  # the k-quasis' row codes, made converting them to text: for the histogram
    classified, findings = classify_findings(frame, spec, exact=False, codes=codes)
    area = scratch
    for number, evidence in enumerate(findings.identifiers.values()):
        # Distinct values' hashes stay in the scratch; the flow counts their union only when needed.
        hashes = evidence.hashes
        assert hashes is not None, "classify_findings(exact=False) hashes every column's distinct values"
        area.write(hashes, "hashes", number, piece.index)
        evidence.distinct, evidence.hashes = len(hashes), None
    values = None
    if all(pd.api.types.is_float_dtype(classified[q.column].dtype) for q in spec.roles.e_quasi):
        histogram = histogram_of(classified, spec, extremes=True, codes=codes)
        tuple_of_record, histogram.of_record = histogram.of_record, None
        columns = [q.column for q in spec.roles.k_quasi]
        hashes = tuple_hashes(histogram.tuples, columns)  # each distinct tuple hashed once, here only
        bucket_of_tuple = write_partials(area, histogram, columns, len(plan.pieces), piece.index, hashes)
        values = histogram.values
        # Each record's tuple (its number in the piece's histogram) and each tuple's bucket go with the records:
        # the distribution gives a record its tuple's class, read back by bucket in the partials' order. Their
        # text as codes (text_codes.py): the k-quasis' from the codes their conversion to text made.
        known = {column: known_text_codes(classified[column], row_codes) for column, row_codes in codes.items()}
        records, encoded = encode_text(classified, known=known)
        area.write((records, tuple_of_record, bucket_of_tuple, encoded), "classified", piece.index)
        # The officer's certificate: this piece's counts of what the release will change (tasks/certificate_dask.py).
        area.write(source_sketch(classified, spec), SOURCE_SKETCH, piece.index)
    return Intake(piece.index, len(frame), findings, short, values)


def distinct_count(scratch: Scratch, column_number: int, pieces: int) -> int:
    """Distinct values of one column over every piece: the union of the pieces' value hashes."""
    area = scratch
    union = np.zeros(0, dtype=np.uint64)
    for index in range(pieces):
        union = np.union1d(union, area.read("hashes", column_number, index))
    return len(union)


@dataclass
class TableIntake:
    """The whole table's intake: rows, the pieces' offsets, the findings and the sensitive value counts
    (the histogram itself stays in the scratch, in partials by bucket: ``tasks/shards.py``)."""

    rows: int
    offsets: list[int]
    findings: Findings
    values: dict


def combine_intakes(intakes: list[Intake], spec: ReleaseSpec, distinct_counter) -> TableIntake:
    """Add the pieces' intakes up and refuse exactly what the in-memory ingest and ``classify`` refuse.

    ``distinct_counter(column_number)`` counts a column's distinct values exactly; it is called only for
    a column the pieces' counts cannot clear of near-uniqueness (their distinct counts add up to more than
    ``NEAR_UNIQUE_RATIO`` of the records).
    """
    intakes = sorted(intakes, key=lambda item: item.index)
    short = [line for item in intakes for line in item.short]
    refuse_short_records(short)
    rows = sum(item.rows for item in intakes)
    if rows == 0:
        raise InputError(None, "the table has no records")
    findings = intakes[0].findings
    for item in intakes[1:]:
        findings = findings.add(item.findings)
    names = spec.roles.names()
    for number, (column, evidence) in enumerate(findings.identifiers.items()):
        # After adding up, ``distinct`` is the pieces' distinct counts summed: an upper bound.
        assert evidence.distinct is not None, "every intake counts its distinct values (``intake``)"
        suspicious = evidence.present >= NEAR_UNIQUE_MIN_ROWS and evidence.distinct > NEAR_UNIQUE_RATIO * evidence.present
        if suspicious and column not in names["e_quasi"]:
            evidence.distinct = distinct_counter(number)
    refuse_findings(findings, spec)
    offsets = np.cumsum([0] + [item.rows for item in intakes])[:-1].tolist()
    # Every piece has its counts once the findings pass: ``values`` is None only for ε-quasis refused above.
    counts = [item.values for item in intakes if item.values is not None]
    assert len(counts) == len(intakes), "refuse_findings refuses ε-quasis that are not numbers"
    values = {column: _add_counts([piece[column] for piece in counts]) for column in counts[0]}
    return TableIntake(rows, offsets, findings, values)


# --------------------------------------------------------------------------- anonymise


def anonymise(histogram: TupleHistogram, spec: ReleaseSpec) -> AnonymisedTuples:
    """The classes of the whole table's tuples (Mondrian or OLA on the histogram), as ``k_anonymise`` finds them."""
    return k_anonymise_histogram(histogram, spec)


def class_extremes(histogram: TupleHistogram, class_of_tuple: np.ndarray, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the smallest and largest clamped value of an ε-quasi: the reduction of its tuples' extremes."""
    kept = class_of_tuple >= 0
    n_classes = int(class_of_tuple.max()) + 1 if kept.any() else 0
    low, high = histogram.extremes[column]
    class_low = np.full(n_classes, np.inf)
    class_high = np.full(n_classes, -np.inf)
    np.minimum.at(class_low, class_of_tuple[kept], low[kept])
    np.maximum.at(class_high, class_of_tuple[kept], high[kept])
    return class_low, class_high


def certain_linking_share(histogram: TupleHistogram, class_of_tuple: np.ndarray, spec: ReleaseSpec) -> float:
    """``metrics.certain_linking_risk`` from the histogram: the largest share, over ε-quasis, of the kept
    records whose class has zero diameter (diameter basis only)."""
    kept = class_of_tuple >= 0
    records = int(histogram.weights[kept].sum())
    if spec.scale_basis != "diameter" or records == 0:
        return 0.0
    shares = []
    for quasi in spec.roles.e_quasi:
        low, high = class_extremes(histogram, class_of_tuple, quasi.column)
        zero = (high - low) == 0
        shares.append(int(histogram.weights[kept][zero[class_of_tuple[kept]]].sum()) / records)
    return max(shares, default=0.0)


def class_targets(histogram: TupleHistogram, class_of_tuple: np.ndarray, parts: int) -> np.ndarray:
    """The class partition of every class: consecutive class ids, about ``records / parts`` records each,
    a class never split (a class larger than that fills a partition of its own)."""
    kept = class_of_tuple >= 0
    n_classes = int(class_of_tuple.max()) + 1 if kept.any() else 0
    sizes = np.bincount(class_of_tuple[kept], weights=histogram.weights[kept], minlength=n_classes)
    before = np.cumsum(sizes) - sizes
    share = max(sizes.sum() / max(parts, 1), 1.0)
    return np.minimum((before // share).astype(np.int64), parts - 1)


# --------------------------------------------------------------------------- B. distribute

# scratch: (class partition, piece) the ε-quasi columns of the piece's records in that class partition, with their
# classes: all the prediction before ε reads (its records' other columns are decrypted and unpickled only once,
# by the perturbation).
NUMERIC_SHUFFLE = "shuffle-numbers"


def distribute(index: int, offset: int, scratch: Scratch, numeric: list[str]) -> int:
    """Stage B on one piece: each record's class (its tuple's: :func:`piece_classes`), then its records to
    their class partitions (``targets``: the class partition of every class), and their ε-quasi columns
    (``numeric``) apart for the prediction (``NUMERIC_SHUFFLE``).

    The records' index becomes their source position (the piece's offset plus their place in it); the
    anonymiser's suppressed records (class -1, OLA) go nowhere. Returns the records kept.
    """
    area = scratch
    frame, tuple_of_record, bucket_of_tuple, encoded = area.read("classified", index)  # text as codes
    class_ids = piece_classes(area, index, bucket_of_tuple)[tuple_of_record]
    target_of_class = area.read("targets")
    kept = np.flatnonzero(class_ids >= 0)
    frame.index = frame.index + offset  # the piece's own positions, from 0, become the source's
    order, runs = by_target(target_of_class[class_ids[kept]])
    grouped, grouped_ids = frame.iloc[kept[order]], class_ids[kept[order]]
    for target, rows in runs:
        records = grouped.iloc[rows]
        area.write((records, grouped_ids[rows], encoded), "shuffle", target, index)
        area.write((records[numeric], grouped_ids[rows]), NUMERIC_SHUFFLE, target, index)
    fault_point("worker-distribute")
    return len(kept)


def piece_classes(scratch: Scratch, index: int, bucket_of_tuple: np.ndarray) -> np.ndarray:
    """The class of each distinct tuple of piece ``index`` (-1: suppressed), its tuples numbered as in its
    histogram: bucket by bucket, as the bucket's task wrote them (``shards.write_piece_classes``, in the order
    of the piece's partial, which holds the bucket's tuples in the histogram's order). No tuple is matched or
    hashed again: a shard's merge placed each partial's tuples, so a tuple hash shared by two tuples changes
    nothing here."""
    from .shards import PIECE_CLASSES

    class_of_tuple = np.full(len(bucket_of_tuple), -1, dtype=np.int64)
    order, runs = by_target(bucket_of_tuple)
    for bucket, tuples in runs:
        classes = scratch.read(PIECE_CLASSES, index, bucket)
        if len(classes) != tuples.stop - tuples.start:  # the bucket's partial was this piece's tuples of it
            raise RuntimeError("a piece's tuples and its bucket's classes differ in number")
        class_of_tuple[order[tuples]] = classes
    return class_of_tuple


# --------------------------------------------------------------------------- group codes


@dataclass(frozen=True)
class GroupCoder:
    """Integer codes for what the reductions count: a published group (its k-quasi labels, one int64
    key) and a sensitive value (its code in the criterion's domain). Codes, not values, cross processes."""

    columns: tuple[str, ...]
    vocabularies: tuple[pd.Index, ...]  # per k-quasi: every label its hierarchy can publish
    radices: tuple[int, ...]
    sensitive: tuple[str, ...]
    domains: tuple[pd.Index, ...]  # per sensitive column: its criterion's domain (value strings)
    numeric: tuple[bool, ...]

    @classmethod
    def build(cls, spec: ReleaseSpec, hierarchies: dict, criteria: list) -> "GroupCoder":
        columns = tuple(q.column for q in spec.roles.k_quasi)
        vocabularies = tuple(
            pd.Index(pd.unique(np.concatenate([np.asarray(level, dtype=object) for level in hierarchies[c].labels])))
            for c in columns
        )
        radices = tuple(len(vocabulary) for vocabulary in vocabularies)
        if np.prod([float(r) for r in radices]) >= 2.0**62:
            raise SpecError("roles.k_quasi", "the hierarchies' labels are too many to number published groups "
                                             "on the dask engine; use the memory engine")
        return cls(
            columns, vocabularies, radices,
            tuple(c.column for c in criteria), tuple(c.index for c in criteria), tuple(c.numeric for c in criteria),
        )

    def keys(self, labels: pd.DataFrame) -> np.ndarray:
        """The group key of each row's labels (mixed radix over the label codes)."""
        key = np.zeros(len(labels), dtype=np.int64)
        for column, vocabulary, radix in zip(self.columns, self.vocabularies, self.radices):
            values = labels[column]
            if isinstance(values.dtype, pd.CategoricalDtype):  # stage C's labels: their distinct ones listed already
                codes, distinct = values.array.codes, values.array.categories
            else:
                codes, distinct = pd.factorize(values)  # labels repeat: match each distinct one once
            key = key * radix + vocabulary.get_indexer(pd.Index(distinct, dtype=object))[codes]
        return key

    def labels(self, keys: np.ndarray) -> pd.DataFrame:
        """The labels of group keys (what the published rows of those groups hold)."""
        columns = {}
        rest = np.asarray(keys, dtype=np.int64)
        for column, vocabulary, radix in reversed(list(zip(self.columns, self.vocabularies, self.radices))):
            rest, code = np.divmod(rest, radix)
            columns[column] = pd.array(np.asarray(vocabulary, dtype=object)[code], dtype=str)
        return pd.DataFrame({column: columns[column] for column in self.columns})

    def value_codes(self, number: int, values: pd.Series) -> np.ndarray:
        """Domain codes of a sensitive column's values (every value read is in its domain)."""
        codes = domain_codes(values, self.numeric[number], self.domains[number])
        if (codes < 0).any():
            raise InputError(self.sensitive[number], f"{int((codes < 0).sum())} value(s) are outside the sensitive column's domain")
        return codes.astype(np.int64)

    def values(self, number: int, codes: np.ndarray) -> np.ndarray:
        """Values of domain codes as the published table holds them (``None`` for a missing value)."""
        strings = np.asarray(self.domains[number], dtype=object)[np.asarray(codes, dtype=np.int64)]
        strings[strings == MISSING] = None
        return strings


@dataclass
class GroupCounts:
    """Published groups counted: per group key its records, and per sensitive column (group, code, records)."""

    keys: np.ndarray
    sizes: np.ndarray
    values: list[pd.DataFrame]  # per sensitive column: columns key, code, records

    @classmethod
    def count(cls, keys: np.ndarray, codes: list[np.ndarray]) -> "GroupCounts":
        """Records per group key, and per (key, code) of each sensitive column, both in key (then code) order.
        Each pair is one integer (the key's rank among the keys × the domain's width + the code), counted
        after one sort of values, not by a hashed group-by over two columns."""
        unique, rank = unique_inverse(np.asarray(keys, dtype=np.int64))
        sizes = np.bincount(rank, minlength=len(unique)).astype(np.int64)
        return cls(unique, sizes, [_pair_counts(unique, rank, np.asarray(column, dtype=np.int64)) for column in codes])

    @classmethod
    def empty(cls, columns: int) -> "GroupCounts":
        """No group (of a partition without published records), with ``columns`` sensitive columns."""
        table = pd.DataFrame({"key": np.zeros(0, np.int64), "code": np.zeros(0, np.int64), "records": np.zeros(0, np.int64)})
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), [table.copy() for _ in range(columns)])

    @classmethod
    def add(cls, counts: list["GroupCounts"]) -> "GroupCounts":
        keys = np.concatenate([c.keys for c in counts])
        sizes = np.concatenate([c.sizes for c in counts])
        unique, inverse = np.unique(keys, return_inverse=True)
        total = np.bincount(inverse.reshape(-1), weights=sizes, minlength=len(unique)).astype(np.int64)
        columns = len(counts[0].values)
        values = [
            pd.concat([c.values[number] for c in counts], ignore_index=True)
            .groupby(["key", "code"], sort=True)["records"].sum().reset_index()
            for number in range(columns)
        ]
        return cls(unique, total, values)

    def without(self, failing: np.ndarray) -> "GroupCounts":
        """The counts of the groups not in ``failing`` (keys)."""
        keep = ~np.isin(self.keys, failing)
        values = [table[~table["key"].isin(failing)].reset_index(drop=True) for table in self.values]
        return GroupCounts(self.keys[keep], self.sizes[keep], values)

    def matrices(self, criteria: list) -> list[np.ndarray]:
        """Per criterion, the (groups × domain) count matrix, groups in key order."""
        result = []
        for criterion, table in zip(criteria, self.values):
            groups = np.searchsorted(self.keys, table["key"].to_numpy(dtype=np.int64))  # keys are sorted
            result.append(group_value_counts(
                groups, table["code"].to_numpy(dtype=np.int64), len(self.keys), len(criterion.domain),
                table["records"].to_numpy(dtype=np.float64),
            ))
        return result


# Pairs are counted in a table of (groups × domain) cells where it has at most this many cells per record (a
# partition's groups times a sensitive column's domain: 17k × 48 for the fine population's largest at 10M rows),
# one pass over the records instead of a sort of them; a wider table (a domain of thousands) is counted by a sort.
PAIR_CELLS_PER_RECORD = 8


def _pair_counts(unique: np.ndarray, rank: np.ndarray, codes: np.ndarray) -> pd.DataFrame:
    """Records per (key, code): columns key, code, records, one row per pair present, sorted."""
    width = int(codes.max()) + 1 if len(codes) else 1  # codes are ≥ 0 (GroupCoder.value_codes refuses others)
    pairs = rank * width + codes  # a pair's cell: its key's rank, then its code
    cells = len(unique) * width
    if cells <= PAIR_CELLS_PER_RECORD * len(pairs):
        counts = np.bincount(pairs, minlength=cells)
        present = np.flatnonzero(counts)
        records = counts[present]
    else:
        present, records = np.unique(pairs, return_counts=True)  # a sort of values, then runs
    return pd.DataFrame({"key": unique[present // width], "code": present % width, "records": records.astype(np.int64)})


def failing_groups(groups: GroupCounts, criteria: list) -> np.ndarray:
    """Keys of the published groups that fail a declared criterion (``suppress_failing_groups``' rule)."""
    enforced = [(number, c) for number, c in enumerate(criteria) if c.declared]
    if not enforced or not len(groups.keys):
        return np.zeros(0, dtype=np.int64)
    matrices = groups.matrices(criteria)
    ok = np.ones(len(groups.keys), dtype=bool)
    for number, criterion in enforced:
        ok &= criterion.satisfied(matrices[number])
    return groups.keys[~ok]


# --------------------------------------------------------------------------- C. perturb and suppress


@dataclass
class ClassPartition:
    """What a class partition tells the flow (counts, codes and private figures; no value)."""

    index: int
    records: int
    perturbation: dict
    suppression: dict
    groups: GroupCounts
    classes: pd.DataFrame  # per class: class, key (-1: none published), published, linked:<col>..., predicted, measured
    errors: dict  # per ε-quasi: sums and counts of the relative errors over perturbed records
    meta: pd.DataFrame | None = field(default=None, repr=False)  # the published columns' types (no row)
    # The error figure's frame: its classes shown and their errors' extremes (``tasks/group_reduction.py``
    # sets it when it moves ``groups`` and ``classes`` to the scratch).
    error_extremes: ErrorExtremes | None = None


def order_ranges(keys: np.ndarray, parts: int) -> np.ndarray:
    """The range (0..parts-1) of each release-order key: equal slices of the 64-bit key space, in order."""
    high = (np.asarray(keys, dtype=np.uint64) >> np.uint64(32)).astype(np.uint64)
    return ((high * np.uint64(parts)) >> np.uint64(32)).astype(np.int64)


def perturb_and_suppress(
    index: int,
    pieces: int,
    scratch: Scratch,
    spec: ReleaseSpec,
    streams: RecordStreams,
    hierarchies: dict,
    levels: dict | None,
    coder: GroupCoder,
    parts: int,
) -> ClassPartition:
    """Stage C on one class partition (whole classes): the engine's stage sequence on whole classes
    (``kepsilon.engine.stages.noise_and_suppress``), then the labels and the reductions for the steps that
    need every partition."""
    area = scratch
    loaded = area.read_present("shuffle", index, count=pieces)
    if not loaded:
        return ClassPartition(index, 0, {}, {}, GroupCounts.empty(len(coder.sensitive)), pd.DataFrame(), {})
    roles = spec.roles.names()
    k_quasi = roles["k_quasi"]
    # The k-quasis and sensitive columns stay codes (text_codes.py): asked once per distinct value, handed on.
    kept, class_ids, encoded = concat_shuffled(loaded, {*k_quasi, *roles["sensitive"], *coder.sensitive})
    perturbed, suppression = noise_and_suppress(kept, class_ids, spec, streams)  # the engine's steps 1 and 2
    published = ~suppression.removed  # diversity suppression (step 3) needs every partition: at publish
    # Each k-quasi matched against its hierarchy's leaves once, for the labels and the predicted groups.
    leaves = {column: per_distinct(kept[column], encoded, hierarchies[column].leaf_codes)
              for column in k_quasi if column in hierarchies}
    every = published_label_codes(kept[k_quasi], class_ids, np.ones(len(kept), dtype=bool), hierarchies, levels, leaves)
    numbers = relabel_after_suppression(every, kept[k_quasi], class_ids, published, hierarchies, levels, leaves)
    labels = label_categoricals(numbers, hierarchies, kept.index)
    merged = merge_release_columns(labels, kept, perturbed.frame, roles)
    keys = coder.keys(labels)
    codes = [per_distinct(kept[column], encoded, partial(coder.value_codes, number))
             for number, column in enumerate(coder.sensitive)]
    groups = GroupCounts.count(keys[published], [column[published] for column in codes])
    if not area.exists(PREDICTED_SKETCH, index):  # the certificate's predicted groups (made before ε with a risk gate)
        area.write(predicted_sketch(kept, class_ids, spec, hierarchies, levels, leaves, every), PREDICTED_SKETCH, index)
    expected = release_expected_errors(kept, perturbed.scales, spec)  # per record, for both tables below
    classes = _class_table(kept, perturbed, class_ids, published, keys, spec, expected)
    errors = _error_sums(kept, perturbed, expected, spec)
    positions = source_positions(kept)
    order_keys = streams.order_keys(positions)
    candidates = np.flatnonzero(published)
    order, runs = by_target(order_ranges(order_keys[candidates], parts))
    chosen = candidates[order]  # the published records, range by range
    # Text as codes for the two gathers (here into ranges, at publish into the published order): text_codes.py.
    # The labels are codes already, and the sensitive columns still are.
    encoded_frame, ordered_encoded = encode_text(
        merged, coded=tuple(k_quasi) + tuple(column for column in encoded if column in merged.columns and column not in k_quasi))
    # For the certificate's sketch; a source k-quasi's values are its hierarchy's leaves, coded already.
    leaf_categories = {column: (codes, pd.Index(hierarchies[column].leaves, dtype=text_dtype(kept[column], encoded)))
                       for column, codes in leaves.items()}
    encoded_source, source_encoded = encode_text(kept[source_columns(spec)], known=leaf_categories)
    frame = encoded_frame.iloc[chosen].reset_index(drop=True)
    source = encoded_source.iloc[chosen].reset_index(drop=True)
    arrays = {"positions": positions[chosen], "order": order_keys[chosen], "keys": keys[chosen]}
    chosen_codes = [column[chosen] for column in codes]
    for target, rows in runs:
        area.write(
            {"frame": frame.iloc[rows].reset_index(drop=True), **{name: values[rows] for name, values in arrays.items()},
             "codes": [column[rows] for column in chosen_codes], "source": source.iloc[rows].reset_index(drop=True),
             "encoded": ordered_encoded, "source_encoded": source_encoded},
            "ordered", target, index,
        )
    return ClassPartition(index, len(kept), perturbed.report, suppression.report, groups, classes, errors,
                          empty_like(decode_text(encoded_frame.iloc[:0], ordered_encoded)))  # the published types


def label_categoricals(codes: dict[str, np.ndarray], hierarchies: dict, index: pd.Index) -> pd.DataFrame:
    """The labels of ``published_label_codes`` as categoricals over each hierarchy's distinct labels: the
    partition's records are gathered twice before publication (text_codes.py), and the labels need not
    become text before then."""
    return pd.DataFrame({column: pd.Categorical.from_codes(numbers, dtype=pd.CategoricalDtype(label_table(hierarchies[column])[1]))
                         for column, numbers in codes.items()}, index=index)


def predict_partition(index: int, pieces: int, scratch: Scratch, spec: ReleaseSpec, draws: int, seed: int,
                      share: float = 1.0) -> Prediction:
    """Before ε: the prediction of one class partition (``kepsilon.engine.predict``, the in-memory path's own
    function on whole classes), from throw-away noise seeded by ``seed``, each draw of a ``share`` of its classes
    (the whole table's design, ``design_for``); the partition stays in the scratch for the perturbation. Returns
    sums only (no value)."""
    loaded = scratch.read_present(NUMERIC_SHUFFLE, index, count=pieces)
    if not loaded:
        return Prediction(draws=draws, share=share, published=np.zeros(draws))
    kept = pd.concat([frame for frame, _ in loaded])
    class_ids = np.concatenate([ids for _, ids in loaded])
    columns = [q.column for q in spec.roles.e_quasi]
    return predict(kept[columns], class_ids, spec, draws, np.random.default_rng(seed), share=share)


def empty_like(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with ``frame``'s columns and types and no row, holding none of its buffers (a slice
    ``frame.iloc[:0]`` would keep the whole partition alive in a task's result, and may pickle it)."""
    return pd.DataFrame({column: pd.Series([], dtype=frame[column].dtype) for column in frame.columns})


def _class_table(kept, perturbed, class_ids, published, keys, spec, expected) -> pd.DataFrame:
    """Per class of the partition: its published group's key, published records, records linked per
    ε-quasi (published ones, by nearest original in the class) and its mean predicted and measured error."""
    classes, dense = unique_inverse(class_ids)
    table = {"class": classes, "published": np.bincount(dense, weights=published, minlength=len(classes)).astype(np.int64)}
    key = np.full(len(classes), -1, dtype=np.int64)
    key[dense[published]] = keys[published]  # the published rows of a class share its labels
    table["key"] = key
    for quasi in spec.roles.e_quasi:
        column = quasi.column
        linked = linked_records(
            kept[column].to_numpy(dtype=np.float64)[published],
            perturbed.frame[column].to_numpy(dtype=np.float64)[published],
            class_ids[published],
        )
        table[f"linked:{column}"] = np.bincount(dense[published], weights=linked, minlength=len(classes)).astype(np.int64)
    predicted, measured = errors_by_class(kept, perturbed.frame, class_ids, perturbed.scales, spec, expected)
    table["predicted"], table["measured"] = predicted, measured
    return pd.DataFrame(table)


def _error_sums(kept, perturbed, expected, spec) -> dict:
    """Per ε-quasi: the sums behind the release's mean errors (over perturbed records with a non-zero value);
    ``expected``: the records' expected relative errors (``release_expected_errors``)."""
    sums = {}
    for quasi in spec.roles.e_quasi:
        column = quasi.column
        values = kept[column].to_numpy(dtype=np.float64)
        noisy = perturbed.frame[column].to_numpy(dtype=np.float64)
        nonzero = values != 0
        sums[column] = {
            "nonzero": int(nonzero.sum()),
            "zero": int((~nonzero).sum()),
            "predicted": float(expected[column][nonzero].sum()),
            "measured": float((np.abs(noisy[nonzero] - values[nonzero]) / np.abs(values[nonzero])).sum()),
        }
    return sums


# --------------------------------------------------------------------------- reductions of stage C


def add_reports(reports: Sequence[dict | None]) -> dict:
    """Partition reports added up: counts summed, parameters (k, c, ε, grids, texts) kept, mean scales
    weighted by records. Empty or missing reports (a partition with nothing to report) are skipped."""
    present = [r for r in reports if r]
    if not present:
        return {}
    total: dict = {}
    for key, value in present[0].items():
        if isinstance(value, dict):
            total[key] = add_reports([r.get(key) for r in present])
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or key in _PARAMETERS:
            total[key] = value  # a parameter, or a mean the caller recomputes from the parts
        else:
            total[key] = type(value)(sum(r[key] for r in present))  # the parts' reports have the same keys
    return total


_PARAMETERS = {
    "k", "confidence", "epsilon", "epsilon_total", "grid", "scale_basis", "applied", "reason", "noise_streams", "mean_scale",
}


def combine_perturbation(results: list[ClassPartition]) -> dict:
    """The perturbation report of the whole release from its class partitions'."""
    reports = [r.perturbation for r in results if r.perturbation]
    if not reports:
        return {}
    total = add_reports(reports)
    records = [r["records"] for r in reports]
    for column in total.get("columns", {}):
        scales = [r["columns"][column]["mean_scale"] for r in reports]
        total["columns"][column]["mean_scale"] = float(np.dot(scales, records) / max(sum(records), 1))
    total["epsilon_split"] = reports[0]["epsilon_split"]
    return total


# --------------------------------------------------------------------------- D. publish


@dataclass
class PublishedPart:
    """One part of the published dataset: its file, fingerprint, rows, the gate's column checks on it,
    and its groups counted again from the rows written."""

    index: int
    name: str
    sha256: str
    rows: int
    checks: dict
    groups: GroupCounts
    csv_bytes: int = 0


def publish_part(
    index: int,
    pieces: int,
    scratch: Scratch,
    staging: str,
    failing: np.ndarray,
    spec: ReleaseSpec,
    meta: pd.DataFrame,
    write_csv: bool,
    sensitive_columns: int,
) -> PublishedPart:
    """Stage D on one order-key range: drop failing groups, sort into the published order, write the part."""
    from .validate import validate_part

    area = scratch
    loaded = area.read_present("ordered", index, count=pieces)
    encoded: tuple[str, ...] = ()
    source_encoded: tuple[str, ...] = ()
    if loaded:
        frame, encoded = concat_encoded([item["frame"] for item in loaded], [item["encoded"] for item in loaded])
        positions = np.concatenate([item["positions"] for item in loaded])
        order = np.concatenate([item["order"] for item in loaded])
        keys = np.concatenate([item["keys"] for item in loaded])
        codes = [np.concatenate([item["codes"][n] for item in loaded]) for n in range(len(loaded[0]["codes"]))]
        source, source_encoded = concat_encoded([item["source"] for item in loaded],
                                                [item["source_encoded"] for item in loaded])
    else:
        frame, positions, order, keys = meta.copy(), np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64)
        codes = [np.zeros(0, np.int64) for _ in range(sensitive_columns)]
        source = pd.DataFrame({column: pd.Series([], dtype=object) for column in source_columns(spec)})
    keep = ~np.isin(keys, failing)
    ordered = np.flatnonzero(keep)[key_then_position_order(order[keep], positions[keep])]  # RecordStreams.order's rule
    # Where a k-quasi's source values and labels are both codes, the certificate counts their pairs on them
    # (a missing value is code -1: shifted, it is a value like the others).
    pair_codes = {column: (source[column].array.codes[ordered] + 1, frame[column].array.codes[ordered] + 1)
                  for column in spec.roles.names()["k_quasi"] if column in encoded and column in source_encoded}
    frame = decode_text(frame.iloc[ordered].reset_index(drop=True), encoded)
    source = decode_text(source.iloc[ordered].reset_index(drop=True), source_encoded)
    # The officer's certificate: this part's counts and its first records (tasks/certificate_dask.py).
    area.write(part_sketch(frame, source, keys[ordered], spec, pair_codes), PART_SKETCH, index)
    name = f"{DATASET}/part-{index:05d}.parquet"
    sha256 = replace_file(Path(staging) / name, parquet_bytes(frame))
    fault_point("worker-publish-part")
    csv_size = 0
    if write_csv:
        records = csv_records(frame)
        area.write(records, "csv", index)
        csv_size = len(records)
    roles = spec.roles.names()
    checks = validate_part(frame, k_quasi=roles["k_quasi"], e_quasi=roles["e_quasi"], explicit=roles["explicit"])
    groups = GroupCounts.count(keys[ordered], [column[ordered] for column in codes])
    return PublishedPart(index, name, sha256, len(frame), checks, groups, csv_size)


def join_csv(staging: str, scratch: Scratch, header: bytes, parts: int) -> str:
    """Write ``data.csv``: the header, then every part's records in order; returns its SHA-256."""
    import hashlib

    digest = hashlib.sha256(header)
    with _replacing(Path(staging) / DATA_CSV) as handle:
        handle.write(header)
        for index in range(parts):
            records = scratch.read("csv", index)
            handle.write(records)
            digest.update(records)
    return digest.hexdigest()


def replace_file(path: Path, content: bytes) -> str:
    """Write ``content`` to ``path`` under a hidden temporary name, fsync, rename over ``path``; its SHA-256.

    A partition task that runs again (a retry, a Dask worker that died) replaces what its first attempt
    wrote instead of failing on it; a reader never sees half a file. Mode 0666 less the umask, as
    ``publish.write_file``: the staging folder is hidden, and becomes visible in one rename.
    """
    import hashlib

    with _replacing(path) as handle:
        handle.write(content)
    return hashlib.sha256(content).hexdigest()


class _replacing:
    """``with _replacing(path) as handle``: a new hidden file beside ``path``, fsynced and renamed over it
    when the block ends normally, removed when it does not."""

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")

    def __enter__(self):
        descriptor = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.handle = os.fdopen(descriptor, "wb")
        return self.handle

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self.handle.flush()
                os.fsync(self.handle.fileno())
        finally:
            self.handle.close()
        if kind is None:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)


def remove_partials(folder: Path) -> None:
    """Remove the hidden temporary files attempts killed mid-write left in ``folder`` (never published)."""
    for leftover in folder.glob(".*.partial"):
        leftover.unlink(missing_ok=True)


# --------------------------------------------------------------------------- Prefect tasks
#
# A worker runs partition after partition; each task hands back the memory its partition took before
# the next one starts (``release_memory``), so a worker's peak is one partition's, however many it runs.


def release_memory() -> None:
    """Return a finished partition's memory: collect cycles, drop Arrow's cached buffers, trim the C heap.

    Only when the task left the process holding at least ``RELEASE_ABOVE_BYTES`` more than after the
    last release: a small task (a shard's statistics, a leaf's numbering) leaves little to hand back,
    and a full collection and a heap trim cost 30 and 8 ms on average in a 10M-row release's workers
    (about half its tasks now skip them). Whatever a skipped task left stays counted, so the next large
    one releases it.

    After a collection a process freezes what survived it (``gc.freeze``) whenever it imported modules
    since it last did: the modules and libraries a worker imported (about 360k objects: Prefect, Dask,
    pandas, Great Expectations), which live as long as the worker. A full collection then scans only
    what was made since, a partition's objects among them, instead of walking the libraries again after
    every task. Freezing at the first collection only left out what later stages import (Great
    Expectations' checks at publication among them): about 250k objects stayed unfrozen in a worker after
    one release, and each collection took 0.2-0.3 s of its CPU (0.01 s once they were frozen). What else
    survives a freeze (the worker's bookkeeping of the moment) is never collected as a cycle again; a worker
    that has run a release imports little more, so it seldom freezes again.
    """
    import ctypes
    import gc

    import psutil
    import pyarrow as pa

    global _released_at, _frozen_modules
    process = psutil.Process()
    if _frozen_modules and process.memory_info().rss < _released_at + RELEASE_ABOVE_BYTES:
        return
    gc.collect()
    if len(sys.modules) != _frozen_modules:
        gc.freeze()
        _frozen_modules = len(sys.modules)
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
    _released_at = process.memory_info().rss


RELEASE_ABOVE_BYTES = 64 << 20
_released_at = 0  # the process's resident bytes after the last release
# How many modules this process had imported when it last froze its survivors (0: never). Kept here, not asked of
# ``gc.get_freeze_count()``: that counts the frozen objects by walking their list (about 360k after importing what a
# worker imports: 46 ms in a plain process; about 70 ms per call in a worker under cProfile, 38 s of a 10M-row
# release's workers).
_frozen_modules = 0

_heap_allocator_set = False

# glibc's mallopt parameters (malloc.h) and the value given to both: the mmap threshold's largest (32 MiB on 64-bit).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
HEAP_THRESHOLD_BYTES = 32 << 20


def allocate_from_the_heap() -> None:
    """Serve arrays up to 32 MiB from the C heap, which keeps up to 32 MiB freed at its top until the next trim.

    Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_`` set to 64 KiB. glibc then hands back
    the top of its heap whenever 64 KiB of it is free, and setting it also fixes the mmap threshold at
    128 KiB: every NumPy temporary above that is a fresh mapping, faulted in page by page and unmapped
    when freed. Measured in a Dask worker: the release-order keys of 500k records took 0.76 s (0.06 s
    in a plain process), a pandas group-and-sort loop 0.68 s (0.48 s); with the mmap threshold raised,
    0.08 s and 0.48 s; a 10M-row release's worker CPU fell from 26.3 to 17.5 µs per record (the mmap
    threshold alone, py-spy attached to both). The memory
    still goes back to the system between tasks: :func:`release_memory` trims the heap after each.
    Acts once per process, and only where the variable is set (elsewhere glibc raises both thresholds
    by itself as large blocks are freed); nothing happens without glibc.
    """
    global _heap_allocator_set
    if _heap_allocator_set or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return
    _heap_allocator_set = True
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, HEAP_THRESHOLD_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, HEAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


def _partition_task(function):
    """Run ``function`` on a partition with the heap allocator (:func:`allocate_from_the_heap`), then
    release what it took (see :func:`release_memory`)."""
    import functools

    @functools.wraps(function)
    def run(*args, **kwargs):
        allocate_from_the_heap()
        try:
            return function(*args, **kwargs)
        finally:
            release_memory()

    return run


def worth_retrying(failure: BaseException) -> bool:
    """Whether a partition's failure may pass on another try (a worker lost, a full or unreachable file system for a
    moment, a worker's memory): every failure but one on the input or the spec, which would only come again."""
    if isinstance(failure, PartitionFailed):
        failure = failure.failure
    return not isinstance(failure, KepsilonError)


class PartitionFailed(Exception):
    """A batch's partition ``number`` failed with ``failure``: the flow raises ``failure`` itself, that of the
    first failing partition in partition order (the error the in-memory path would meet first). ``where``: the
    traceback it had on its worker, as text (a traceback does not cross a process boundary; the flow makes it
    the cause of the error it raises, as ``concurrent.futures`` does)."""

    def __init__(self, number: int, failure: BaseException, where: str = ""):
        super().__init__(number, failure, where)
        self.number, self.failure, self.where = number, failure, where

    def __str__(self) -> str:
        return f"partition {self.number}: {type(self.failure).__name__}: {self.failure}"


class WorkerTraceback(Exception):
    """A partition's traceback on its worker, as text: the ``__cause__`` of the error the flow raises."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


def run_batch(function, arguments: list[tuple], numbers: list[int]) -> list | PartitionFailed:
    """On a worker (a plain Dask task): one stage's ``function`` on several partitions (or shards, or buckets), one
    after the other, each handing back its memory before the next (``_partition_task``): ``[function(*a) for a in
    arguments]``, their inputs named in the scratch. ``numbers``: the partitions' numbers, in increasing order.

    The first to fail stops the batch, and its failure is handed back as a ``PartitionFailed`` (its number, its
    error, where it was raised), not raised: Dask logs a task that raises, with a rendering of its arguments, on
    the worker's console, and the flow decides what a failure means (a retry, or the release's error)."""
    import traceback

    results = []
    for number, each in zip(numbers, arguments, strict=True):
        try:
            results.append(_partition_task(function)(*each))
        except Exception as failure:  # noqa: BLE001 - handed back to the flow, which raises it
            return PartitionFailed(number, failure, traceback.format_exc())
    return results


# --------------------------------------------------------------------------- the release's figures


@dataclass
class Outcome:
    """The private record's outcome figures of a partitioned release (``release_metrics``' fields), the
    published groups after diversity suppression, and what the private figures need."""

    metrics: ReleaseMetrics
    groups: GroupCounts
    figure_inputs: FigureInputs


@dataclass
class ClassOutcome:
    """One class partition's part of the outcome figures, once the failing groups are known: a size that
    does not grow with its classes (``tasks/group_reduction.py`` adds the parts up in the flow)."""

    sizes: SizeCounts  # published records per class, a frequency of frequencies (classes with none left out)
    diversity_suppressed: int  # published records of classes in failing groups
    linked: dict[str, int]  # per ε-quasi: published records linked, outside failing groups
    points: tuple[np.ndarray, np.ndarray] | None = None  # the error figure's points (at most SCATTER_LIMIT in all)
    cells: ErrorCells | None = None  # or its counts per hexagon


def class_outcome(classes: pd.DataFrame, failing: np.ndarray, spec: ReleaseSpec, extent: Extent | None = None) -> ClassOutcome:
    """A class table's part of ``combine_outcome``'s figures (``ClassPartition.classes``: per class its
    group's key, published records, linked records, errors), the groups ``failing`` a declared criterion
    removed; the error figure's points, or with ``extent`` its counts per hexagon over that extent."""
    columns = [q.column for q in spec.roles.e_quasi]
    if not len(classes):
        empty = np.zeros(0)
        cells = ErrorCells.of(empty, empty, extent) if extent is not None else None
        return ClassOutcome(SizeCounts.of(np.zeros(0, np.int64)), 0, {c: 0 for c in columns},
                            None if extent is not None else (empty, empty), cells)
    keys = classes["key"].to_numpy(dtype=np.int64)
    in_failing = np.isin(keys, failing) & (keys >= 0)
    records = classes["published"].to_numpy(dtype=np.int64)
    published = np.where(in_failing, 0, records)
    linked = {c: int(classes[f"linked:{c}"].to_numpy()[~in_failing].sum()) for c in columns}
    predicted = classes["predicted"].to_numpy(dtype=np.float64)
    measured = classes["measured"].to_numpy(dtype=np.float64)
    if extent is None:
        return ClassOutcome(SizeCounts.of(published[published > 0]), int(records[in_failing].sum()), linked,
                            points=shown_errors(predicted, measured))
    return ClassOutcome(SizeCounts.of(published[published > 0]), int(records[in_failing].sum()), linked,
                        cells=ErrorCells.of(predicted, measured, extent))


def outcome_metrics(results: list[ClassPartition], parts: list[ClassOutcome], anonymiser: dict, spec: ReleaseSpec,
                    criteria: list) -> ReleaseMetrics:
    """``release_metrics``' figures from the class partitions' counts and error sums (``results``) and their
    parts once the failing groups are known (``parts``, any order).

    Counts are exact. The mean errors are sums over partitions divided by counts, so they may differ from
    the in-memory path's in the last bits (the order of a floating-point sum); the linking risk, a ratio
    of counts, does not.
    """
    from kepsilon.engine.metrics import class_statistics_from_size_counts, metrics_summary

    suppression = add_reports([r.suppression for r in results])
    rows_removed = {
        "anonymiser_suppression": int(anonymiser["rows"] - anonymiser["kept_rows"]),
        "confidence_suppression_record_rule": int(suppression.get("removed_by_record_rule", 0)),
        "confidence_suppression_class_rule": int(suppression.get("removed_by_class_rule", 0)),
    }
    if declared(criteria):
        rows_removed["diversity_suppression"] = sum(part.diversity_suppressed for part in parts)
    sizes = SizeCounts.add([part.sizes for part in parts])
    published = sizes.records
    per_column = {}
    for quasi in spec.roles.e_quasi:
        column = quasi.column
        sums = [r.errors[column] for r in results if r.errors]
        nonzero = sum(s["nonzero"] for s in sums)
        linked = sum(part.linked[column] for part in parts)
        per_column[column] = {
            "measured_relative_error": sum(s["measured"] for s in sums) / nonzero if nonzero else 0.0,
            "predicted_relative_error": sum(s["predicted"] for s in sums) / nonzero if nonzero else 0.0,
            "linking_risk": linked / published if published else 0.0,
            "zero_values_excluded": sum(s["zero"] for s in sums),
        }
    classes_report = class_statistics_from_size_counts(sizes.values, sizes.counts, sum(rows_removed.values()))
    # The engine builds them in the record's shape (``ReleaseMetrics``); it does not import the record's types.
    return cast(ReleaseMetrics, metrics_summary(rows_removed, published, per_column, anonymiser.get("precision"),
                                                classes_report))


def combine_outcome(
    results: list[ClassPartition], failing: np.ndarray, groups: GroupCounts, anonymiser: dict, spec: ReleaseSpec,
    criteria: list,
) -> Outcome:
    """Add the class partitions up into ``release_metrics``' figures, with the failing groups removed, from
    their whole results (the reference the flow's reduction, ``tasks/group_reduction.py``, equals: the same
    ``class_outcome`` and ``outcome_metrics``, with every group and class in this process)."""
    tables = [r.classes for r in results if len(r.classes)]
    metrics = outcome_metrics(results, [class_outcome(table, failing, spec) for table in tables], anonymiser, spec, criteria)
    final = groups.without(failing)
    classes = pd.concat(tables, ignore_index=True).sort_values("class", kind="stable") if tables else pd.DataFrame(
        {"predicted": [], "measured": []})
    figure_inputs = FigureInputs.of_arrays(final.sizes, classes["predicted"].to_numpy(dtype=np.float64),
                                           classes["measured"].to_numpy(dtype=np.float64))
    return Outcome(metrics, final, figure_inputs)


def gate_tables(groups: GroupCounts, coder: GroupCoder, criteria: list, weight: str) -> tuple[pd.DataFrame, dict]:
    """The gate's aggregated tables of the published groups: (labels, records) per group, and per
    declared criterion (labels, value, records) per group and value."""
    table = coder.labels(groups.keys)
    table[weight] = groups.sizes
    per_criterion = {}
    for number, criterion in enumerate(criteria):
        if not criterion.declared:
            continue
        values = groups.values[number]
        frame = coder.labels(values["key"].to_numpy(dtype=np.int64))
        frame[criterion.column] = pd.array(coder.values(number, values["code"].to_numpy()), dtype=object)
        frame[weight] = values["records"].to_numpy(dtype=np.int64)
        per_criterion[criterion.column] = frame
    return table, per_criterion
