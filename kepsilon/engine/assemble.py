"""Merging a release's parts into the table to publish, and putting it in its published order.

The last step of the method before writing: the k-quasi labels (made from the published records
only), the noisy ε-quasis and the other columns as they came, without the suppressed records, in
an order that says nothing about classes or values.
"""

import numpy as np
import pandas as pd


def shuffle_records(frame: pd.DataFrame, order: np.ndarray) -> pd.DataFrame:
    """The records in the order given by ``order`` (a permutation), with a fresh 0..n-1 index.

    Mondrian and sorting leave records grouped by class and by value; publishing them in that order
    would let an attacker match rows by position, so release order comes from the release's keyed random
    order (``RecordStreams.order``), which keeps a rerun from the escrowed seed byte-identical.
    """
    if len(order) != len(frame) or not np.array_equal(np.sort(order), np.arange(len(frame))):
        raise ValueError("order must be a permutation of the frame's rows")
    return frame.iloc[order].reset_index(drop=True)


def assemble_release(
    released_quasis: pd.DataFrame,
    kept: pd.DataFrame,
    noisy: pd.DataFrame,
    removed: np.ndarray,
    order: np.ndarray,
    roles: dict[str, list[str]],
) -> pd.DataFrame:
    """Merge the classes into the table to publish: generalised k-quasis, noisy ε-quasis, sensitive
    attributes as they are, in the source's column order, without the suppressed records, shuffled.

    All inputs are aligned row by row with ``kept`` (the records the anonymiser kept).
    """
    shuffled = shuffle_records(merge_release_columns(released_quasis, kept, noisy, roles), order)
    return shuffled[~removed[order]].reset_index(drop=True)


def merge_release_columns(
    released_quasis: pd.DataFrame, kept: pd.DataFrame, noisy: pd.DataFrame, roles: dict[str, list[str]]
) -> pd.DataFrame:
    """The columns to publish, in the source's column order: generalised k-quasis, noisy ε-quasis and
    the other columns as they came, row by row with ``kept`` (same index). The partitioned path merges
    each partition with it and orders the rows itself (by ``RecordStreams.order_keys``, then position)."""
    columns = [c for c in kept.columns if c not in set(roles["explicit"])]
    merged = pd.DataFrame(index=kept.index)
    # ``.array`` keeps each column's dtype (text, or the Arrow type read from Parquet); ``to_numpy``
    # would turn nullable integers into floats and typed values into Python objects.
    for column in columns:
        if column in roles["k_quasi"]:
            merged[column] = released_quasis[column].array
        elif column in roles["e_quasi"]:
            merged[column] = noisy[column].to_numpy()
        else:
            merged[column] = kept[column].array
    return merged
