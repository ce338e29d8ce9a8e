"""The weighted histogram of distinct k-quasi tuples: all Mondrian and OLA need to know about the records.

Both anonymisers decide classes on the distinct k-quasi tuples weighted by their record counts (a
Mondrian cut never separates equal tuples, an OLA node groups equal tuples together), plus, when a
sensitive column declares ℓ-diversity or t-closeness, the sensitive values' counts per tuple. So a
table of any size is anonymised from this histogram, and a partitioned table can build it by a
reduction: each partition counts its own tuples (:func:`tuple_histogram`) and the counts are added up
(:func:`merge_histograms`). The in-memory path builds the same histogram from the whole table, which
is why the two paths produce the same classes.

What makes the two histograms equal, not only equivalent:

* tuples are listed in order of **first occurrence** (``first``: the source position of each tuple's
  first record). Any rule of the engine that depends on order of appearance (class numbering by first
  record, the order in which distinct values are met when a hierarchy is built over the data) then
  gives the same answer from the histogram as from the records;
* counts are integers, and every floating-point figure derived from them (a reference distribution,
  a weighted median) sees the same integers whichever way they were added up.

The histogram also carries what the release needs per tuple before any noise: the value counts of
every sensitive column (the criteria's domain and reference distribution) and the extremes of each
ε-quasi clamped to its public bounds (per class diameters are then the extremes of the class's tuples).
Every figure in it is computed from private data: it never leaves the release's processes.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .criteria import ColumnCriteria, is_numeric_entry, value_counts, value_strings
from .errors import InputError

TUPLE = "tuple"  # column of a pair table: the tuple's row in the histogram
VALUE = "value"  # column of a pair table: the sensitive value's string (criteria.value_strings)
RECORDS = "records"  # column of a pair table: how many records hold the pair


@dataclass
class TupleHistogram:
    """The distinct k-quasi tuples of a table with their record counts (module docstring).

    ``tuples``: one row per distinct tuple (the k-quasi columns, values as in the table), ordered by
    ``first``. ``weights``: records per tuple. ``first``: source position of each tuple's first record
    (increasing). ``values``: per sensitive column, records per value string. ``pairs``: per sensitive
    column that declares a criterion, a frame (``tuple``, ``value``, ``records``) of the (tuple, value)
    pairs present. ``extremes``: per ε-quasi, the (smallest, largest) value of each tuple's records after
    clamping to the public bounds. ``of_record``: the tuple of each record, only when the histogram was
    built from one frame (the in-memory path maps classes back to its records with it).
    """

    tuples: pd.DataFrame
    weights: np.ndarray
    first: np.ndarray
    values: dict[str, pd.Series] = field(default_factory=dict)
    pairs: dict[str, pd.DataFrame] = field(default_factory=dict)
    extremes: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    of_record: np.ndarray | None = field(default=None, repr=False)

    @property
    def records(self) -> int:
        return int(self.weights.sum())

    def tuple_of_record(self) -> np.ndarray:
        """The tuple of each record; a histogram added up from partial ones does not know its records."""
        if self.of_record is None:
            raise ValueError("this histogram was added up from partial histograms: it has no records' tuples")
        return self.of_record

    def __len__(self) -> int:
        return len(self.weights)


def _column(entry) -> str:
    return entry if isinstance(entry, str) else entry.column


def _numeric(entry) -> bool:
    """Whether the entry (a spec entry, or a built ``ColumnCriteria``) compares its values as numbers."""
    return entry.numeric if isinstance(entry, ColumnCriteria) else is_numeric_entry(entry)


def _declares(entry) -> bool:
    if isinstance(entry, ColumnCriteria):
        return entry.declared
    return not isinstance(entry, str) and (entry.l_diversity is not None or entry.t_closeness is not None)


def tuple_histogram(
    frame: pd.DataFrame,
    columns: list[str],
    sensitive: Sequence = (),
    e_quasis: Sequence = (),
    positions: np.ndarray | None = None,
    codes: Mapping[str, np.ndarray] | None = None,
) -> TupleHistogram:
    """The histogram of ``frame``'s k-quasi ``columns``.

    ``sensitive``: the spec's sensitive entries (a name, a ``SensitiveColumn``, or a built
    ``criteria.ColumnCriteria``): every one gets its
    value counts, the ones declaring a criterion their (tuple, value) pairs. ``e_quasis``: the spec's
    ε-quasis (``column``, ``lower``, ``upper``), whose clamped extremes are kept per tuple.
    ``positions``: each row's position in the source (default: the row number); rows must be in
    increasing position, as every stage keeps them. ``codes``: for some of ``columns``, a non-negative code per
    row, equal exactly when the rows' values are (a missing value's code its own), left by an earlier
    factorisation of the column; the others are factorised here. The histogram is the same either way.
    """
    positions = np.arange(len(frame), dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    of_record = _tuple_numbers(frame, list(columns), codes or {})
    n_tuples = int(of_record.max()) + 1 if len(of_record) else 0
    first_rows = np.full(n_tuples, len(frame), dtype=np.int64)
    np.minimum.at(first_rows, of_record, np.arange(len(frame), dtype=np.int64))
    histogram = TupleHistogram(
        tuples=frame[list(columns)].iloc[first_rows].reset_index(drop=True),
        weights=np.bincount(of_record, minlength=n_tuples).astype(np.int64),
        first=positions[first_rows],
        of_record=of_record,
    )
    for entry in sensitive:
        column = _column(entry)
        numeric = _numeric(entry)
        histogram.values[column] = value_counts(frame[column], numeric)
        if _declares(entry):
            strings = value_strings(frame[column], numeric)
            pairs = pd.DataFrame({TUPLE: of_record, VALUE: strings.to_numpy(dtype=object)})
            histogram.pairs[column] = pairs.groupby([TUPLE, VALUE], sort=True).size().rename(RECORDS).reset_index()
    for quasi in e_quasis:
        values = np.clip(frame[quasi.column].to_numpy(dtype=np.float64), quasi.lower, quasi.upper)
        low = np.full(n_tuples, np.inf)
        high = np.full(n_tuples, -np.inf)
        np.minimum.at(low, of_record, values)
        np.maximum.at(high, of_record, values)
        histogram.extremes[quasi.column] = (low, high)
    return histogram


_COMBINED_SPAN = 2**62  # the mixed-radix numbers of a tuple's codes stay below this (int64, with room)


def combined_codes(columns: Sequence[tuple[np.ndarray, int]], rows: int) -> np.ndarray:
    """One int64 code per row (of ``rows``) for its combination of the columns' codes, equal exactly where the
    combinations are. ``columns``: per column, a non-negative code per row and a bound above its codes. The
    codes are combined in mixed radix; the running combination is renumbered (factorised) only where the next
    column would take it past ``_COMBINED_SPAN``. The codes are not in order of first appearance:
    ``pd.factorize`` them for that."""
    combined = np.zeros(rows, dtype=np.int64)
    span = 1
    for codes, width in columns:
        width = max(int(width), 1)
        if span * width >= _COMBINED_SPAN:
            combined, seen = pd.factorize(combined)
            span = max(len(seen), 1)
        combined = combined * width + codes
        span *= width
    return combined


def _tuple_numbers(frame: pd.DataFrame, columns: list[str], given: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each row's tuple of ``columns``, numbered in order of first appearance (which is the order of first
    position), a missing value counted as a value: ``frame.groupby(columns, sort=False, dropna=False,
    observed=True).ngroup()``, without building the groups' index: each column's codes (``given``, else its
    factorisation) combined (:func:`combined_codes`), then factorised once. The numbers of first appearance of
    whole tuples are the same whatever codes name the values."""
    coded = []
    for column in columns:
        codes = given.get(column)
        if codes is None:
            codes, distinct = pd.factorize(frame[column], use_na_sentinel=False)
            coded.append((codes, len(distinct)))
        else:
            coded.append((codes, int(codes.max()) + 1 if len(codes) else 1))
    numbers, _ = pd.factorize(combined_codes(coded, len(frame)))
    return numbers.astype(np.int64, copy=False)


def merge_histograms(parts: list[TupleHistogram], columns: list[str]) -> TupleHistogram:
    """The histogram of the union of disjoint tables from theirs: counts added, first positions and
    extremes reduced, tuples in order of first occurrence. Equal to the histogram of the whole table."""
    return merge_histograms_placing(parts, columns)[0]


def merge_histograms_placing(parts: list[TupleHistogram], columns: list[str]) -> tuple[TupleHistogram, np.ndarray]:
    """:func:`merge_histograms`, and where each part's tuples went: the merged position of every tuple of
    ``parts``, part after part (a part's tuples in its own order). A partitioned release keeps these to hand
    each piece the classes of its own tuples, without matching them again."""
    parts = [part for part in parts if len(part)] or parts[:1]
    stacked = pd.concat([part.tuples for part in parts], ignore_index=True)
    group = stacked.groupby(list(columns), sort=False, dropna=False, observed=True).ngroup().to_numpy(dtype=np.int64)
    n_tuples = int(group.max()) + 1 if len(group) else 0
    first_stacked = np.concatenate([part.first for part in parts])
    first = np.full(n_tuples, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, group, first_stacked)
    weights = np.bincount(group, weights=np.concatenate([part.weights for part in parts]), minlength=n_tuples)
    # Renumber the merged tuples by first position (the order of first occurrence in the whole table).
    order = np.argsort(first, kind="stable")
    renumber = np.empty(n_tuples, dtype=np.int64)
    renumber[order] = np.arange(n_tuples)
    tuple_of_stacked = renumber[group]
    representative = np.full(n_tuples, len(stacked), dtype=np.int64)
    np.minimum.at(representative, tuple_of_stacked, np.arange(len(stacked), dtype=np.int64))
    merged = TupleHistogram(
        tuples=stacked.iloc[representative].reset_index(drop=True),
        weights=np.rint(weights[order]).astype(np.int64),
        first=first[order],
    )
    offsets = np.cumsum([0] + [len(part) for part in parts])
    for column in parts[0].values:
        merged.values[column] = _add_counts([part.values[column] for part in parts])
    for column in parts[0].pairs:
        tables = [
            part.pairs[column].assign(**{TUPLE: tuple_of_stacked[offset + part.pairs[column][TUPLE].to_numpy()]})
            for part, offset in zip(parts, offsets)
        ]
        merged.pairs[column] = (
            pd.concat(tables, ignore_index=True).groupby([TUPLE, VALUE], sort=True)[RECORDS].sum().reset_index()
        )
    for column in parts[0].extremes:
        low = np.full(n_tuples, np.inf)
        high = np.full(n_tuples, -np.inf)
        np.minimum.at(low, tuple_of_stacked, np.concatenate([part.extremes[column][0] for part in parts]))
        np.maximum.at(high, tuple_of_stacked, np.concatenate([part.extremes[column][1] for part in parts]))
        merged.extremes[column] = (low, high)
    return merged, tuple_of_stacked


def _add_counts(counts: list[pd.Series]) -> pd.Series:
    """Value counts added up over partitions (records per value string)."""
    stacked = pd.concat(counts)
    return stacked.groupby(level=0, sort=False).sum().astype(np.int64)


def pair_codes(histogram: TupleHistogram, criterion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A declared criterion's (tuple, domain code, records) pairs, as the anonymisers count them.

    Refuses (like ``ColumnCriteria.codes``) a value outside the criterion's domain, by count.
    """
    pairs = histogram.pairs[criterion.column]
    codes = criterion.index.get_indexer(pairs[VALUE].to_numpy(dtype=object))
    records = pairs[RECORDS].to_numpy(dtype=np.int64)
    if (codes < 0).any():
        raise InputError(
            criterion.column, f"{int(records[codes < 0].sum())} value(s) are outside the sensitive column's domain"
        )
    return pairs[TUPLE].to_numpy(dtype=np.int64), codes.astype(np.int64), records


def take_tuples(histogram: TupleHistogram, positions: np.ndarray) -> TupleHistogram:
    """The histogram of some of its tuples (``positions``, in the order given): counts, first positions,
    extremes and pairs of those tuples, renumbered. Value counts are not kept (they are the whole table's)."""
    positions = np.asarray(positions, dtype=np.int64)
    renumber = np.full(len(histogram), -1, dtype=np.int64)
    renumber[positions] = np.arange(len(positions))
    taken = TupleHistogram(
        tuples=histogram.tuples.iloc[positions].reset_index(drop=True),
        weights=histogram.weights[positions],
        first=histogram.first[positions],
    )
    for column, pairs in histogram.pairs.items():
        new = renumber[pairs[TUPLE].to_numpy(dtype=np.int64)]
        kept = pairs[new >= 0].assign(**{TUPLE: new[new >= 0]})
        taken.pairs[column] = kept.reset_index(drop=True)
    for column, (low, high) in histogram.extremes.items():
        taken.extremes[column] = (low[positions], high[positions])
    return taken


def split_tuples(histogram: TupleHistogram, targets: np.ndarray) -> list[tuple[int, np.ndarray, TupleHistogram]]:
    """:func:`take_tuples` for every target at once: per target present (ascending), the positions of its
    tuples (ascending) and their histogram. ``targets``: one non-negative integer per tuple (a bucket, a leaf).

    The tuples are gathered once, target by target, and each target's part is a slice of that gather
    (its pairs, sorted by tuple once, too), where a gather per target passed over every tuple and pair
    again for each target."""
    targets = np.asarray(targets, dtype=np.int64)
    order = np.argsort(targets, kind="stable")
    grouped = targets[order]
    present = np.unique(grouped)
    starts = np.searchsorted(grouped, present, side="left")
    ends = np.searchsorted(grouped, present, side="right")
    taken = take_tuples(histogram, order)
    pairs = {}
    for column, table in taken.pairs.items():
        tuples = table[TUPLE].to_numpy(dtype=np.int64)
        by_tuple = np.argsort(tuples, kind="stable")  # each tuple's pairs keep their order (by value)
        pairs[column] = (table.iloc[by_tuple].reset_index(drop=True), tuples[by_tuple])
    parts = []
    for target, start, end in zip(present, starts, ends):
        part = TupleHistogram(
            tuples=taken.tuples.iloc[start:end].reset_index(drop=True),
            weights=taken.weights[start:end],
            first=taken.first[start:end],
        )
        for column, (table, tuples) in pairs.items():
            low, high = np.searchsorted(tuples, [start, end])
            part.pairs[column] = table.iloc[low:high].assign(**{TUPLE: tuples[low:high] - start}).reset_index(drop=True)
        for column, (smallest, largest) in taken.extremes.items():
            part.extremes[column] = (smallest[start:end], largest[start:end])
        parts.append((int(target), order[start:end], part))
    return parts


def concat_disjoint(parts: list[TupleHistogram]) -> TupleHistogram:
    """The histogram of tables with no tuple in common, their tuples one part after the other (not in order
    of first occurrence: for a consumer that does not depend on the order, such as Mondrian's recursion)."""
    offsets = np.cumsum([0] + [len(part) for part in parts])
    joined = TupleHistogram(
        tuples=pd.concat([part.tuples for part in parts], ignore_index=True),
        weights=np.concatenate([part.weights for part in parts]),
        first=np.concatenate([part.first for part in parts]),
    )
    for column in parts[0].pairs:
        joined.pairs[column] = pd.concat(
            [part.pairs[column].assign(**{TUPLE: part.pairs[column][TUPLE].to_numpy(dtype=np.int64) + offset})
             for part, offset in zip(parts, offsets)], ignore_index=True)
    for column in parts[0].extremes:
        joined.extremes[column] = (np.concatenate([part.extremes[column][0] for part in parts]),
                                   np.concatenate([part.extremes[column][1] for part in parts]))
    return joined
