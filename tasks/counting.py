"""Counting distinct values and pairs on integer codes, in order of first occurrence.

The partitioned stages count records per value and per pair of values on every record of a partition.
pandas' ``value_counts(sort=False)`` gives those counts in order of first occurrence, but on text columns
it first turns every record into a Python object (a NumPy object array) and back; these functions count
on integer codes instead and touch the values of one record per distinct value only, with the same rows,
order and types.
"""

import numpy as np
import pandas as pd


def first_occurrences(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``codes`` numbered in order of first occurrence: per record its number, and per number the
    record where it first occurs."""
    numbers, distinct = pd.factorize(np.asarray(codes, dtype=np.int64))  # hashed: numbered as first met
    firsts = np.full(len(distinct), len(numbers), dtype=np.int64)
    np.minimum.at(firsts, numbers, np.arange(len(numbers), dtype=np.int64))
    return numbers.astype(np.int64, copy=False), firsts


def value_pair_counts(values: pd.Series, labels: pd.Series) -> pd.DataFrame:
    """Records per (value, label), pairs in order of first occurrence, a missing value counted as a value:
    ``DataFrame({"value": values.to_numpy(), "label": labels.to_numpy()}).value_counts(sort=False,
    dropna=False).rename("records").reset_index()``, with one record per pair converted to NumPy."""
    value_codes, _ = pd.factorize(values, use_na_sentinel=False)
    label_codes, label_uniques = pd.factorize(labels, use_na_sentinel=False)
    numbers, rows = first_occurrences(value_codes.astype(np.int64) * max(len(label_uniques), 1) + label_codes)
    frame = pd.DataFrame({"value": values.iloc[rows].to_numpy(), "label": labels.iloc[rows].to_numpy()})
    frame["records"] = np.bincount(numbers, minlength=len(rows)).astype(np.int64)
    return frame
