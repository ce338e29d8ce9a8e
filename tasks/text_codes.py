"""Text columns carried as codes between two Dask stages, and given back as the text they were.

Stage C (perturb) hands its records to stage D (publish) in an order that is random with respect to
their storage: each range of release-order keys gathers records from everywhere in the partition. A
gather of Arrow text is slow at random (about 140 ns a value on a 500,000-row partition, against 10 ns
for its integer codes), and the records are gathered twice: once into ranges (C), once into the
published order (D). So stage C turns each text column into a categorical (its distinct values once,
an integer code per record) just before its gather, and stage D turns it back into the same text, of the
same type, once the records are in their published order.

The records' text columns travel as codes from the start, too: intake encodes them before the records go to
the scratch (the k-quasis from the codes their conversion to text made, :func:`known_text_codes`), the
distribution gathers codes, and stage C reads its class partition's pieces with :func:`concat_shuffled`. Its
k-quasis and sensitive columns stay codes there: what it asks of their values (a hierarchy's leaf, a
criterion's domain code) it asks once per distinct value (:func:`per_distinct`), and they are handed to stage D
as they are. Its other text columns are given back as text first.

Only text columns are encoded (a pandas string type, or Arrow's ``string``/``large_string`` as a CSV's
sensitive columns are read), and each piece says which (``encoded``): a column that came from the source
as a categorical (a Parquet dictionary) stays one and is published as one. A missing value stays
missing: it has no code (-1) and is given back as its type's missing value.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa


def is_text(dtype) -> bool:
    """Whether a column of this dtype is encoded: pandas' string types and Arrow's text types."""
    if isinstance(dtype, pd.StringDtype):
        return True
    return isinstance(dtype, pd.ArrowDtype) and (pa.types.is_string(dtype.pyarrow_dtype)
                                                 or pa.types.is_large_string(dtype.pyarrow_dtype))


def encode_text(frame: pd.DataFrame, coded: tuple[str, ...] = (),
                known: Mapping[str, tuple[np.ndarray, pd.Index]] | None = None) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """``frame`` with every column of a string type as a categorical of its values, and the names of the
    columns to give back as text: those, after ``coded`` (columns made as categoricals of text already,
    as stage C makes the k-quasi labels). Other columns are shared, not copied. ``known``: for some
    columns, codes and categories the caller has already (the column's values are ``categories[codes]``,
    in the column's text type; a source k-quasi's are its hierarchy's leaves): they are encoded with these,
    not factorised again, whatever the frame holds for them, and pieces that share the categories are joined
    without merging them (``concat_encoded``)."""
    encoded = tuple(column for column in frame.columns if column not in coded
                    and (is_text(frame[column].dtype) or (known is not None and column in known)))
    if not encoded:
        return frame, tuple(coded) + encoded
    columns = {}
    for column in frame.columns:
        if column in encoded and known is not None and column in known:
            codes, categories = known[column]
            columns[column] = pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(categories))
        elif column in encoded:
            codes, distinct = pd.factorize(frame[column])  # a missing value has code -1
            columns[column] = pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(distinct))
        else:
            columns[column] = frame[column].array
    return pd.DataFrame(columns, index=frame.index), tuple(coded) + encoded


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
    # Column by column: dropping the encoded columns from each piece first copied every other column.
    columns = {column: (_union(frames, column) if column in encoded
                        else pd.concat([frame[column] for frame in frames], ignore_index=True).array)
               for column in frames[0].columns}
    return pd.DataFrame(columns), encoded


def _union(frames: list[pd.DataFrame], column: str) -> pd.Categorical:
    pieces = [frame[column].array for frame in frames]
    first = pieces[0].categories
    if all(piece.categories is first or piece.categories.equals(first) for piece in pieces[1:]):
        return pd.Categorical.from_codes(np.concatenate([piece.codes for piece in pieces]), dtype=pieces[0].dtype)
    every = first.append([piece.categories for piece in pieces[1:]])
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


def known_text_codes(texts: pd.Series, row_codes: np.ndarray) -> tuple[np.ndarray, pd.api.extensions.ExtensionArray]:
    """``encode_text``'s ``known`` for a text column from codes made with it, equal exactly when the rows'
    texts are, a missing text having a code like the others (``classify.k_quasi_texts_and_codes``): the codes
    with a missing text's as -1, and each code's text, in the column's type. One text is read per code."""
    count = int(row_codes.max()) + 1 if len(row_codes) else 0
    some_row = np.full(count, -1, dtype=np.int64)
    some_row[row_codes] = np.arange(len(row_codes), dtype=np.int64)  # any row of a code has its text
    texts_of_codes = texts.array.take(some_row, allow_fill=True)  # a code no row has (-1) reads as missing
    absent = np.asarray(texts_of_codes.isna(), dtype=bool)
    renumbered = np.cumsum(~absent, dtype=np.int64) - 1
    renumbered[absent] = -1
    return renumbered[row_codes], texts_of_codes[~absent]


def concat_shuffled(pieces: list[tuple], keep_encoded: set[str]) -> tuple[pd.DataFrame, np.ndarray, tuple[str, ...]]:
    """A class partition's pieces from the distribution (``(records, class ids, encoded)`` each) one under
    another, with their source positions as index: the records, their classes, and the columns still
    encoded, those of ``keep_encoded`` (the others are given back as text)."""
    frame, encoded = concat_encoded([records for records, _, _ in pieces], [own for _, _, own in pieces])
    frame.index = pd.Index(np.concatenate([records.index.to_numpy(dtype=np.int64) for records, _, _ in pieces]))
    give_back = tuple(column for column in encoded if column not in keep_encoded)
    if give_back:
        frame = decode_text(frame, give_back)
    class_ids = np.concatenate([ids for _, ids, _ in pieces])
    return frame, class_ids, tuple(column for column in encoded if column in keep_encoded)


def text_dtype(values: pd.Series, encoded: tuple[str, ...]):
    """The type of a column's text: its own, or its categories' where it is encoded."""
    return values.array.categories.dtype if values.name in encoded else values.dtype


def per_distinct(values: pd.Series, encoded: tuple[str, ...], answer: Callable[[pd.Series], np.ndarray]) -> np.ndarray:
    """``answer(values)`` (one answer per row, each row's its value's alone) for a column that may be encoded:
    then asked of its distinct values as text, the ones its rows hold (a missing value too, if one is), and
    read back row by row. The same answers, and the same refusals, as asking the text itself."""
    if values.name not in encoded:
        return answer(values)
    codes = np.asarray(values.array.codes, dtype=np.int64)
    held = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(values.array.categories)))
    missing = bool((codes < 0).any())
    chosen = np.append(held, -1) if missing else held
    distinct = pd.Series(values.array.categories.array.take(chosen, allow_fill=True), name=values.name)
    position = np.full(len(values.array.categories) + 1, -1, dtype=np.int64)  # a category's row in ``distinct``
    position[held] = np.arange(len(held))
    position[-1] = len(held)  # code -1: the missing value, last
    return np.asarray(answer(distinct))[position[codes]]
