"""Counting distinct values and pairs on integer codes, in order of first occurrence; grouping rows by target.

The partitioned stages count records per value and per pair of values on every record of a partition.
pandas' ``value_counts(sort=False)`` gives those counts in order of first occurrence, but on text columns
it first turns every record into a Python object (a NumPy object array) and back; these functions count
on integer codes instead and touch the values of one record per distinct value only, with the same rows,
order and types.
"""

import numpy as np
import pandas as pd

from kepsilon.engine.hierarchy import ClassRuns
from kepsilon.engine.histogram import combined_codes


def first_occurrences(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``codes`` numbered in order of first occurrence: per record its number, and per number the
    record where it first occurs."""
    numbers, distinct = pd.factorize(np.asarray(codes, dtype=np.int64))  # hashed: numbered as first met
    firsts = np.full(len(distinct), len(numbers), dtype=np.int64)
    np.minimum.at(firsts, numbers, np.arange(len(numbers), dtype=np.int64))
    return numbers.astype(np.int64, copy=False), firsts


def value_pair_counts(values: pd.Series, labels: pd.Series, codes: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """Records per (value, label), pairs in order of first occurrence, a missing value counted as a value:
    ``DataFrame({"value": values.to_numpy(), "label": labels.to_numpy()}).value_counts(sort=False,
    dropna=False).rename("records").reset_index()``, with one record per pair converted to NumPy.

    ``codes``: the values' and the labels' codes when the caller has them already (integers from 0, equal
    exactly where the values are, a missing value included), so that neither column is factorised here."""
    if codes is None:
        value_codes, _ = pd.factorize(values, use_na_sentinel=False)
        label_codes, _ = pd.factorize(labels, use_na_sentinel=False)
    else:
        value_codes, label_codes = codes
    width = int(label_codes.max()) + 1 if len(label_codes) else 1
    numbers, rows = first_occurrences(np.asarray(value_codes, dtype=np.int64) * width + label_codes)
    frame = pd.DataFrame({"value": values.iloc[rows].to_numpy(), "label": labels.iloc[rows].to_numpy()})
    frame["records"] = np.bincount(numbers, minlength=len(rows)).astype(np.int64)
    return frame


def column_codes(frame: pd.DataFrame, columns: list[str]) -> dict[str, tuple[np.ndarray, int]]:
    """Per column, its values' codes (a missing value counted as a value) and how many distinct values it
    has: factorised once for every combination that uses the column (:func:`combination_codes`)."""
    result = {}
    for column in columns:
        codes, distinct = pd.factorize(frame[column], use_na_sentinel=False)
        result[column] = (codes.astype(np.int64, copy=False), len(distinct))
    return result


def combination_codes(codes: dict[str, tuple[np.ndarray, int]], columns: list[str], rows: int) -> np.ndarray:
    """One int64 code per row (of ``rows``) for its combination of values in ``columns`` (equal combinations
    get equal codes), from the columns' :func:`column_codes` (``kepsilon.engine.histogram.combined_codes``).
    With :func:`first_occurrences`, the groups of ``frame.groupby(columns, sort=False, dropna=False,
    observed=True).ngroup()``, without the groups' index."""
    return combined_codes([codes[column] for column in columns], rows)


def by_target(targets: np.ndarray) -> tuple[np.ndarray, list[tuple[int, slice]]]:
    """Rows grouped by their target (a partition, a range, a shard) in one pass: ``order`` sorts them by
    target, stably (each target's rows keep their order), and per target present, the slice of ``order``
    that holds its rows. Gathering the rows once in ``order`` and slicing costs one copy of the rows, where a
    mask per target cost a pass over every row and column per target."""
    runs = ClassRuns.of(np.asarray(targets))  # the same stable sort and runs as the classes' labels use
    ends = np.append(runs.starts[1:], len(runs.order))
    return runs.order, [(int(target), slice(int(start), int(end)))
                        for target, start, end in zip(runs.classes, runs.starts, ends)]


def slices_by_target(targets: np.ndarray, count: int) -> tuple[np.ndarray, list[slice]]:
    """:func:`by_target` for targets numbered 0..count-1: ``order``, and for every target its slice of it
    (empty for a target no row goes to), indexed by the target."""
    order, runs = by_target(targets)
    slices = [slice(0, 0)] * count
    for target, rows in runs:
        slices[target] = rows
    return order, slices
