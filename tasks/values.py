"""Values as read: the text form of a cell, the type a column is published with, strict numbers.

kepsilon never guesses what a value means. A CSV cell is the exact text between its delimiters; a
Parquet column keeps its Arrow type. Only the spec decides that a value is missing (``source.missing``
for CSV, a null for Parquet) or numeric (an ε-quasi). This module holds the few rules that turn typed
values into text and back, so that ingest, classify, the hierarchies and publish apply the same ones:

* ``cell_texts``: the text of every cell as ``data.csv`` writes it (``None`` for a missing value). It
  is also the text a typed k-quasi is matched against its hierarchy's leaves with. ``cell_text_array``
  gives the same texts as an Arrow array, which ``data.csv`` is quoted and joined from.
* ``published_type``: the Arrow type a column is written with in ``data.parquet``, decided by the
  column's dtype alone (never by its values), so the manifest can name it without reading any record.
* ``parse_numbers``: an ε-quasi's text as numbers, strictly.
"""

import base64
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InputError

BASE64 = "base64"

# A decimal number written plainly: optional sign, ASCII digits, optional fraction and exponent.
# Nothing else: no spaces, no thousands separators, no underscores, no nan/inf, no hexadecimal.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def arrow_type(dtype) -> pa.DataType | None:
    """The Arrow type behind a pandas dtype read from Parquet (``None`` for a NumPy or text dtype)."""
    return dtype.pyarrow_dtype if isinstance(dtype, pd.ArrowDtype) else None


def _is_binary(data_type: pa.DataType) -> bool:
    return pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type)


def _value_type(data_type: pa.DataType) -> pa.DataType:
    """The values' type: a dictionary column is rendered as its values are."""
    return data_type.value_type if pa.types.is_dictionary(data_type) else data_type


def csv_encoding(dtype) -> str | None:
    """How ``data.csv`` encodes the column when its text is not the value itself: ``base64`` for bytes."""
    data_type = arrow_type(dtype)
    if data_type is not None and _is_binary(_value_type(data_type)):
        return BASE64
    return None


def unpublishable_reason(dtype) -> str | None:
    """Why a column of this dtype cannot be published exactly in ``data.csv`` (``None`` if it can).

    Nested Arrow types (lists, structs, maps, unions) have no one text form a CSV reader would give
    back; they are refused rather than written in a form nobody declared.
    """
    data_type = arrow_type(dtype)
    if data_type is None:
        return None
    value_type = _value_type(data_type)
    if pa.types.is_nested(value_type) or pa.types.is_union(value_type) or pa.types.is_dictionary(value_type):
        return f"has the Arrow type {value_type}, which data.csv cannot carry exactly"
    return None


def cell_texts(series: pd.Series) -> np.ndarray:
    """Each cell's text as ``data.csv`` writes it; ``None`` where the value is missing (an empty cell).

    Text is written as it is. Typed values (from Parquet) use Arrow's own text cast: integers and
    decimals as their digits (a decimal at its scale, ``12.30``), dates ``YYYY-MM-DD``, timestamps
    ``YYYY-MM-DD hh:mm:ss`` with the fraction of their unit and, with a time zone, the local time and
    its ``±hhmm`` offset, booleans ``true``/``false``; bytes as base64 (``csv_encoding``). Floats are
    written as their shortest round-trip decimal (``nan``, ``inf`` and ``-inf`` included), which is how
    pandas wrote them before; a NumPy float NaN is a missing value (NumPy cannot tell NaN from null).
    """
    texts = cell_text_array(series)
    if isinstance(texts, pa.DictionaryArray):
        texts = texts.dictionary_decode()
    return texts.to_numpy(zero_copy_only=False)


def cell_text_array(series: pd.Series) -> pa.Array:
    """:func:`cell_texts` as an Arrow ``large_string`` array (null where the value is missing), made
    without a Python string per cell where the column allows it; a dictionary or categorical column
    stays a dictionary array over the texts of its distinct values, each made once."""
    data_type = arrow_type(series.dtype)
    if data_type is not None:
        if pa.types.is_string(data_type) or pa.types.is_string_view(data_type):
            return _one_text_array(pa.array(series.array))
        return _arrow_texts(pa.chunked_array(pa.array(series.array)).combine_chunks(), data_type)
    if isinstance(series.dtype, pd.CategoricalDtype):
        categories = cell_text_array(pd.Series(series.cat.categories))
        codes = series.cat.codes.to_numpy()
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), categories)
    if series.dtype.kind == "f":
        return _number_texts(series.to_numpy(), series.isna().to_numpy())
    if series.dtype.kind in "iub":
        return _number_texts(series.to_numpy(), None)
    if isinstance(series.dtype, pd.StringDtype):  # a concatenated column's Arrow storage has several chunks
        return _one_text_array(pa.array(series.array))
    values = series.to_numpy(dtype=object, na_value=None)
    try:  # text as it is, converted in Arrow
        inferred = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        inferred = None
    if inferred is not None and (pa.types.is_string(inferred.type) or pa.types.is_large_string(inferred.type)):
        return _one_text_array(inferred)
    # A cell that is not text (a number, a date, bytes) is written as str() writes it.
    return pa.array([None if value is None else str(value) for value in values], type=pa.large_string())


def _one_text_array(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Text in one ``large_string`` array: cast before the chunks are joined, since a column over 2 GiB of
    text (Arrow infers or reads it in chunks of 32-bit offsets) cannot be joined under 32-bit offsets."""
    return pa.chunked_array(texts).cast(pa.large_string()).combine_chunks()


def _number_texts(numbers: np.ndarray, missing: np.ndarray | None) -> pa.Array:
    """NumPy's text of each number (the shortest round-trip decimal of a float), as an Arrow array."""
    numbers = np.asarray(numbers)
    if numbers.dtype != np.float64:
        return pa.array(numbers.astype(str), mask=missing, type=pa.large_string())
    # Arrow's cast writes the same shortest round-trip digits about 8 times faster than NumPy, but writes an
    # integral value without ".0" and picks the exponent form by other rules: those rows (integral, not
    # finite, outside NumPy's positional range [1e-4, 1e16), or in exponent form) are written by NumPy.
    texts = pc.cast(pa.array(numbers, mask=missing), pa.large_string())
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(numbers)
        numpy_rows = ~((magnitude >= 1e-4) & (magnitude < 1e16) & (numbers != np.trunc(numbers)))
    numpy_rows |= pc.match_substring(texts, "e").fill_null(False).to_numpy(zero_copy_only=False)
    if missing is not None:
        numpy_rows &= ~missing
    if numpy_rows.any():
        rows = np.flatnonzero(numpy_rows)
        texts = pc.replace_with_mask(texts, pa.array(numpy_rows), pa.array(numbers[rows].astype(str), type=pa.large_string()))
    return texts


def _arrow_texts(array: pa.Array, data_type: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(data_type):
        dictionary = _arrow_texts(array.dictionary, data_type.value_type)
        return pa.DictionaryArray.from_arrays(array.indices, dictionary)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return array.cast(pa.large_string())
    if _is_binary(data_type):
        return pa.array(
            [None if value is None else base64.b64encode(value).decode("ascii") for value in array.to_pylist()],
            type=pa.large_string(),
        )
    if pa.types.is_floating(data_type):
        return _number_texts(array.to_numpy(zero_copy_only=False), array.is_null().to_numpy(zero_copy_only=False))
    return pc.cast(array, pa.large_string())


def published_type(series: pd.Series) -> pa.DataType:
    """The Arrow type ``data.parquet`` gives the column: read from its dtype, never from its values.

    Text (CSV cells, k-quasi labels) is ``large_string``; an ε-quasi's noisy values ``double``; a
    column read from Parquet keeps the type it was read with.
    """
    data_type = arrow_type(series.dtype)
    if data_type is not None:
        return data_type
    if isinstance(series.dtype, pd.StringDtype) or series.dtype == object:
        return pa.large_string()
    return pa.from_numpy_dtype(series.dtype)


def parse_numbers(texts: pd.Series, column: str) -> np.ndarray:
    """An ε-quasi's texts as float64, strictly: every value must be a plain decimal number.

    Refused with an ``InputError`` naming the column and counting the values that are not numbers
    (never quoting them); the caller has already refused missing values.
    """
    numbers, not_numbers = read_numbers(texts)
    refuse_non_numbers(column, not_numbers)
    assert numbers is not None
    return numbers


def read_numbers(texts: pd.Series) -> tuple[np.ndarray | None, int]:
    """An ε-quasi's texts as float64 when every one is a plain decimal number (else None), and how many are not:
    each text matched once (counting, then converting, matched every text twice: 1.2 s of worker CPU each time in
    a 10M-row release)."""
    strings = texts.astype(str)
    parses = strings.str.fullmatch(_NUMBER.pattern).to_numpy(dtype=bool, na_value=False)
    not_numbers = int((~parses).sum())
    if not_numbers:
        return None, not_numbers
    if _arrow_strings(strings) is not None:
        return _arrow_float64(strings), 0
    return strings.to_numpy(dtype=object).astype(np.float64), 0


def _arrow_strings(strings: pd.Series) -> pa.ChunkedArray | None:
    """The Arrow array under an Arrow-backed text column, or None."""
    array = getattr(strings.array, "_pa_array", None)
    return array if array is not None and (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)) else None


def _arrow_float64(strings: pd.Series) -> np.ndarray:
    """Plain decimal texts (checked by ``parse_numbers``) as float64, converted by Arrow without a Python
    string per value. Arrow's parser rounds correctly, as ``float()`` does, so both give the same double;
    a text Arrow will not take (an overflow to infinity, say) sends the column through ``float()``."""
    try:
        return pc.cast(_arrow_strings(strings), pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return strings.to_numpy(dtype=object).astype(np.float64)


def refuse_non_numbers(column: str, count: int) -> None:
    """The refusal of ``parse_numbers`` for ``count`` texts that are not plain decimal numbers."""
    if count:
        raise InputError(
            column,
            f"ε-quasi values must be plain decimal numbers; {count} record(s) are not "
            "(digits, an optional sign, point and exponent; nothing else)",
        )
