"""Text columns carried as codes between two Dask stages, and given back as the text they were.

Stage C (perturb) hands its records to stage D (publish) in an order that is random with respect to
their storage: each range of release-order keys gathers records from everywhere in the partition. A
gather of Arrow text is slow at random (about 140 ns a value on a 500,000-row partition, against 10 ns
for its integer codes), and the records are gathered twice: once into ranges (C), once into the
published order (D). So stage C turns each text column into a categorical (its distinct values once,
an integer code per record) just before its gather, and stage D turns it back into the same text, of the
same type, once the records are in their published order.

Only columns of a pandas string type are encoded, and each piece says which (``encoded``): a column that
came from the source as a categorical (a Parquet dictionary) stays one and is published as one. A
missing value stays missing: it has no code (-1) and is given back as its type's missing value.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def encode_text(frame: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """``frame`` with every column of a string type as a categorical of its values, and those columns'
    names. Other columns are shared, not copied."""
    encoded = tuple(column for column in frame.columns if isinstance(frame[column].dtype, pd.StringDtype))
    if not encoded:
        return frame, encoded
    columns = {}
    for column in frame.columns:
        if column in encoded:
            codes, distinct = pd.factorize(frame[column])  # a missing value has code -1
            columns[column] = pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(distinct))
        else:
            columns[column] = frame[column].array
    return pd.DataFrame(columns, index=frame.index), encoded


def concat_encoded(frames: list[pd.DataFrame], encodings: list[tuple[str, ...]]) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The pieces one under another (a fresh index) and the columns still encoded: each encoded column
    over the union of the pieces' values (``pd.concat`` would turn categoricals with different categories
    into Python objects). Pieces that disagree on what they encoded are decoded first."""
    if not frames:
        raise ValueError("concat_encoded needs at least one piece")
    encoded = encodings[0]
    if any(other != encoded for other in encodings):
        decoded = [decode_text(frame, own) for frame, own in zip(frames, encodings)]
        return pd.concat(decoded, ignore_index=True), ()
    joined = pd.concat([frame.drop(columns=list(encoded)) for frame in frames], ignore_index=True)
    for column in encoded:
        joined[column] = _union(frames, column)
    return joined[list(frames[0].columns)], encoded


def _union(frames: list[pd.DataFrame], column: str) -> pd.Categorical:
    pieces = [frame[column].array for frame in frames]
    every = pd.Index(pd.concat([pd.Series(piece.categories) for piece in pieces], ignore_index=True))
    numbered, distinct = pd.factorize(every)
    codes, start = [], 0
    for piece in pieces:
        mapping = np.append(numbered[start:start + len(piece.categories)], -1)  # code -1 (missing) stays -1
        codes.append(mapping[piece.codes])
        start += len(piece.categories)
    return pd.Categorical.from_codes(np.concatenate(codes), dtype=pd.CategoricalDtype(distinct))


def decode_text(frame: pd.DataFrame, encoded: tuple[str, ...]) -> pd.DataFrame:
    """``frame`` with each encoded column given back as the text it was, in its type (one sequential
    gather from its distinct values)."""
    if not encoded:
        return frame
    columns = {}
    for column in frame.columns:
        values = frame[column].array
        if column in encoded:
            values = values.categories.array.take(values.codes, allow_fill=True)
        columns[column] = values
    return pd.DataFrame(columns, index=frame.index)
