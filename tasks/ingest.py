"""Ingest: read the source table and fingerprint it.

The SHA-256 is taken over the exact bytes that are parsed, so the audit record names the file that
produced the release even if it is replaced afterwards.
"""

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pyarrow import csv as arrow_csv
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.flows.spec import SourceFormat, SourceSpec

from .errors import InputError


@dataclass(frozen=True)
class SourceTable:
    """The parsed source and its fingerprint."""

    frame: pd.DataFrame
    sha256: str
    rows: int

    def report(self) -> dict:
        """What the audit record keeps of the source: never its content."""
        return {"sha256": self.sha256, "rows": self.rows, "columns": len(self.frame.columns)}


def read_source(source: SourceSpec) -> SourceTable:
    """Read the source file named by the spec; refuse what cannot be released safely.

    Refused with an ``InputError``: a missing or unreadable file, non-UTF-8 text, a CSV whose rows
    have more or fewer fields than the header (e.g. a truncated file), duplicate column names, an
    empty table.
    """
    path = Path(source.path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(None, f"cannot read {str(path)!r} ({exc.strerror})") from None
    digest = hashlib.sha256(raw).hexdigest()
    if source.resolved_format() is SourceFormat.parquet:
        frame = _parse_parquet(raw)
    else:
        frame = _parse_csv(raw, source)
    if frame.empty:
        raise InputError(None, "the table has no records")
    return SourceTable(frame=frame, sha256=digest, rows=len(frame))


def _parse_csv(raw: bytes, source: SourceSpec) -> pd.DataFrame:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(None, f"the file is not UTF-8 text (first bad byte at offset {exc.start})") from None
    header = None if not source.header else _header(text, source.delimiter)
    names = header if header is not None else list(source.columns or [])
    _refuse_duplicates(names)
    try:
        frame = pd.read_csv(
            io.StringIO(text),
            sep=source.delimiter,
            header=None,
            names=names,
            skiprows=1 if source.header else 0,
            on_bad_lines="error",
            skip_blank_lines=True,
        )
    except pd.errors.ParserError as exc:
        # pandas' message gives a line number and field counts, never a value.
        raise InputError(None, f"malformed CSV: {exc}".strip()) from None
    except pd.errors.EmptyDataError:
        raise InputError(None, "the table has no records") from None
    _refuse_short_records(raw, source, names)
    return frame


def _refuse_short_records(raw: bytes, source: SourceSpec, names: list[str]) -> None:
    """Refuse records with fewer fields than the header.

    pandas pads a short record with NaN without a word, so a truncated file (last record cut
    mid-field) would be released with a shortened value; pyarrow's parser reports such rows.
    """
    short: list[int | None] = []

    def note(row) -> str:
        if row.actual_columns < row.expected_columns:
            short.append(row.number)
        return "skip"

    try:
        arrow_csv.read_csv(
            io.BytesIO(raw),
            read_options=arrow_csv.ReadOptions(column_names=names, skip_rows=1 if source.header else 0, use_threads=False),
            parse_options=arrow_csv.ParseOptions(delimiter=source.delimiter, newlines_in_values=True, invalid_row_handler=note),
            convert_options=arrow_csv.ConvertOptions(column_types={name: pa.string() for name in names}),
        )
    except pa.ArrowInvalid:
        return  # pandas has already parsed the file; its verdict stands
    if short:
        where = f" (first at line {short[0]})" if short[0] is not None else ""
        raise InputError(
            None, f"{len(short)} record(s) have fewer fields than the header{where}; the file may be truncated"
        )


def _header(text: str, delimiter: str) -> list[str]:
    first_line = text.split("\n", 1)[0].rstrip("\r")
    if not first_line.strip():
        raise InputError(None, "the file is empty or has no header line")
    return next(csv.reader([first_line], delimiter=delimiter))


def _refuse_duplicates(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError(name, "appears more than once in the header")
        seen.add(name)


def _parse_parquet(raw: bytes) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(io.BytesIO(raw))
    except Exception as exc:  # pyarrow raises many types; none carries data values worth keeping
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    _refuse_duplicates([str(c) for c in frame.columns])
    return frame


@task(name="ingest", cache_policy=NO_CACHE, persist_result=False)
def ingest_source(source: SourceSpec) -> SourceTable:
    """Prefect task: read and fingerprint the source."""
    return read_source(source)
