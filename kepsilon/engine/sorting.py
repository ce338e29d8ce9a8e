"""Sorts of integer keys and numbering of distinct values, with NumPy's answers, faster on large arrays.

The per-class steps sort every record of a partition by class (and value) several times. NumPy's
``argsort`` of int64 costs about 130 ns a record on 10⁶ records where its ``sort`` costs about 20: the
vectorised sort exists for values, not for indices. So :func:`stable_argsort` sorts values that carry
their own index (the key shifted left, the position in the low bits) and reads the order back from the
low bits: the same order as ``np.argsort(keys, kind="stable")``, equal keys in position order. It falls
back to NumPy where key span and positions do not fit in 63 bits together. Keys spanning fewer than 2¹⁶
values are sorted as 16-bit integers, by NumPy's radix sort. Keys already grouped at a coarse scale
(:func:`mostly_ascending`) are sorted by NumPy's merge of runs rather than its quicksort.

:func:`unique_inverse` numbers distinct values as ``np.unique(values, return_inverse=True)`` does
(sorted distinct values, each value's rank among them), by hashing (``pd.factorize``) and sorting only
the distinct values. Equal floats share a rank (−0.0 and 0.0 too), and every NaN shares the last.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

_BITS = 63  # packed words stay non-negative int64
RADIX_SPAN = 1 << 16  # keys spanning fewer values fit uint16 once their smallest is subtracted


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for a 1-D array of integers (int64 positions)."""
    keys = np.asarray(keys)
    count = len(keys)
    if count < 2 or keys.ndim != 1 or keys.dtype.kind not in "iu":
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    low, high = int(keys.min()), int(keys.max())
    if high - low < RADIX_SPAN:
        # Few distinct keys (class partitions, ranges, a partition's classes): NumPy's stable sort of 16-bit
        # integers is a radix sort, 4-6 times faster than the packed sort below (measured here on 0.5-1.5M keys).
        return np.argsort(_above(keys, low).astype(np.uint16), kind="stable").astype(np.int64, copy=False)
    shift = (count - 1).bit_length()
    if (high - low).bit_length() + shift > _BITS:
        return np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    packed = (_above(keys, low).astype(np.int64, copy=False) << shift) | np.arange(count, dtype=np.int64)
    # The packed words are distinct, so every sort kind gives the same order; the kind is chosen for speed.
    packed.sort(kind="stable" if mostly_ascending(keys) else "quicksort")
    return packed & ((1 << shift) - 1)


def _above(keys: np.ndarray, low: int) -> np.ndarray:
    """``keys − low`` without overflow, for keys whose span fits 63 bits (both callers check it first):
    uint64 keys are subtracted in uint64 (those above 2⁶³ do not fit int64), the others in int64."""
    return keys - keys.dtype.type(low) if keys.dtype.kind == "u" else keys.astype(np.int64, copy=False) - low


def radix_sortable(keys: np.ndarray) -> bool:
    """Whether :func:`stable_argsort` sorts ``keys`` (integers) by NumPy's radix sort: they span fewer than
    2¹⁶ values."""
    return bool(len(keys)) and keys.dtype.kind in "iu" and int(keys.max()) - int(keys.min()) < RADIX_SPAN


_STRIDE = 32  # one key in 32 is compared with the one 32 places on


def mostly_ascending(keys: np.ndarray) -> bool:
    """Whether ``keys`` are already nearly in ascending order at a coarse scale: fewer than one in eight of
    the keys 32 places apart descend. Keys of rows grouped by class (``class·W + rank``, ClassSortedValues)
    are, whatever their order within a class, and NumPy's stable sort (a merge of runs) then sorts them
    2.4-4 times faster than its quicksort (1M keys in 1 to 60 class-sorted runs: 12-27 ms against 51-64 ms,
    measured here); on keys in random order it is about 10 % slower. The check reads one key in 32."""
    coarse = keys[::_STRIDE]
    if len(coarse) < 2:
        return False
    return int(np.count_nonzero(coarse[1:] < coarse[:-1])) * 8 < len(coarse)


def key_then_position_order(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``np.lexsort((positions, keys))``: the rows sorted by key, rows with equal keys by position.

    The published order's keys are keyed random 64-bit words (``RecordStreams.order_keys``), distinct
    unless two of them collide: one sort by key then decides the order, and the positions are read only
    when a tie is found (a lexsort sorts by both, 3-5 times slower on 500k records, measured here)."""
    keys = np.asarray(keys)
    order = np.argsort(keys)
    ordered = keys[order]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        return np.lexsort((positions, keys))
    return order


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for a 1-D array of numbers: the sorted distinct values
    and each value's index among them (int64)."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        distinct, inverse = np.unique(values, return_inverse=True)
        return distinct, inverse.reshape(-1).astype(np.int64, copy=False)
    codes, uniques = pd.factorize(values, use_na_sentinel=False)  # numbered as first met, hashed
    uniques = np.asarray(uniques, dtype=values.dtype)
    order = np.argsort(uniques, kind="stable")  # NaN sorts last, as in np.unique
    rank = np.empty(len(uniques), dtype=np.int64)
    rank[order] = np.arange(len(uniques), dtype=np.int64)
    return uniques[order], rank[codes]
