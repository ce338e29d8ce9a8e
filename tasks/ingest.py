"""Ingest: read the source table and fingerprint it.

The fingerprint is taken over the exact bytes that are parsed, so the audit record names the file that
produced the release even if it is replaced afterwards. It is keyed — HMAC-SHA256 under the installation's
fingerprint key (``audit/fingerprint.py``), never a plain SHA-256 — so a copy of the store cannot confirm
a guessed source. (The field keeps its historical name ``sha256``.)

Nothing is guessed here. A CSV is read as text: every cell is the exact string between its
delimiters (no NA words, no numbers, no booleans), so ``NA``, ``007`` and ``9007199254740993`` stay
what they are. A plain CSV (no quote character, no carriage return) is parsed by Arrow straight into
Arrow strings, in one pass that also finds short or long records (``arrow_csv_cells``); any other file,
and any file Arrow finds a bad record in, is parsed by pandas as before, whose errors are the ones
reported — both give the same frame (same cells, same ``str`` dtype); which cells are missing and which columns are numbers is decided per role by
``classify`` from the spec. A Parquet file keeps its Arrow schema: every column is held as a pandas
``ArrowDtype`` over the Arrow data (nullable integers, NaN distinct from null, dictionaries, decimals,
dates, timestamps with their time zone).

A folder is a Parquet dataset: its ``*.parquet`` files (hidden ones, starting with ``.`` or ``_``,
left out), in the order of their names, are one table, all with the same schema. Its fingerprint is
the keyed hash over, file after file, the name, a NUL byte, the length as 8 bytes big-endian and the bytes
(``dataset_fingerprint``), so renaming, reordering or changing any file changes it. The partitioned path
(``tasks/sources.py``) reads pieces of the same sources with the same parsing functions, so both paths
see the same values.
"""

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE
from pyarrow import csv as arrow_csv

from kepsilon.audit.fingerprint import source_fingerprint, source_hasher
from kepsilon.spec import SourceFormat, SourceSpec

from .errors import InputError


@dataclass(frozen=True)
class SourceTable:
    """The parsed source and its fingerprint."""

    frame: pd.DataFrame
    sha256: str  # the keyed fingerprint (HMAC-SHA256), under its historical name
    rows: int
    size: int = 0  # bytes of the source file: sizes the output-folder check before ε is reserved

    def report(self) -> dict:
        """What the audit record keeps of the source: never its content."""
        return {"sha256": self.sha256, "rows": self.rows, "columns": len(self.frame.columns)}


def read_source(source: SourceSpec) -> SourceTable:
    """Read the source file named by the spec; refuse what cannot be released safely.

    Refused with an ``InputError``: a missing or unreadable file, non-UTF-8 text, a CSV whose rows
    have more or fewer fields than the header (e.g. a truncated file), duplicate column names, an
    empty table; for a folder, one without Parquet files or whose files differ in schema.
    """
    path = Path(source.path)
    if path.is_dir():
        return _read_dataset(path)
    raw = read_file_bytes(path)
    digest = source_fingerprint(raw)
    if source.resolved_format() is SourceFormat.parquet:
        frame = _parse_parquet(raw)
    else:
        frame = _parse_csv(raw, source)
    if frame.empty:
        raise InputError(None, "the table has no records")
    return SourceTable(frame=frame, sha256=digest, rows=len(frame), size=len(raw))


def read_file_bytes(path: Path) -> bytes:
    """The file's bytes; an unreadable file is refused by name with the system's reason."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(None, f"cannot read {str(path)!r} ({exc.strerror})") from None


_BOM = "\ufeff"


def _parse_csv(raw: bytes, source: SourceSpec) -> pd.DataFrame:
    """Every cell as its exact text (``str`` dtype); no cell is missing or converted here."""
    text = decode_text(raw)
    # Spreadsheet programs start a UTF-8 CSV with a byte-order mark; it is not part of the first name.
    if text.startswith(_BOM):
        text = text[len(_BOM) :]
        raw = raw[len(_BOM.encode("utf-8")) :]
    names = column_names(text, source)
    frame = arrow_csv_cells(raw, source, names, skip_header=source.header)
    if frame is not None:
        return frame
    try:
        frame = parse_csv_text(text, source, names, skip_header=source.header)
    except pd.errors.EmptyDataError:
        raise InputError(None, "the table has no records") from None
    refuse_short_records(short_records(raw, source, names, skip_header=source.header))
    return frame


# pandas' own dtype for ``read_csv(dtype=str)``: Arrow-backed strings whose missing value is NaN.
_CELL_DTYPE = pd.StringDtype("pyarrow", na_value=float("nan"))


def arrow_csv_cells(raw: bytes, source: SourceSpec, names: list[str], skip_header: bool) -> pd.DataFrame | None:
    """The records of plain CSV bytes as exact cell texts, parsed by Arrow (no Python string per cell);
    None where the pandas parser must decide.

    Only a plain CSV takes this path: no quote character (so no quoted delimiter, line break or doubled
    quote, where the two parsers' rules could differ), no carriage return (line ends are ``\n`` only) and
    at least two columns (pandas skips a line of spaces as blank, which in one column would be a record;
    with two or more, such a line has too few fields for Arrow and goes to pandas anyway).
    Every record must have exactly the header's fields and there must be at least one record; otherwise
    None, and the caller's pandas parse reports the problem in its own words (as before this path existed).
    Empty lines are skipped by both parsers; every cell, the empty one included, stays text.
    """
    if len(names) < 2 or b'"' in raw or b"\r" in raw or source.delimiter in ('"', "\n", "\r"):
        return None
    bad_records = 0

    def count_bad(row) -> str:
        nonlocal bad_records
        bad_records += 1
        return "skip"

    try:
        table = arrow_csv.read_csv(
            io.BytesIO(raw),
            read_options=arrow_csv.ReadOptions(column_names=names, skip_rows=1 if skip_header else 0),
            parse_options=arrow_csv.ParseOptions(delimiter=source.delimiter, quote_char=False, ignore_empty_lines=True,
                                                 invalid_row_handler=count_bad),
            convert_options=arrow_csv.ConvertOptions(column_types={name: pa.string() for name in names},
                                                     strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, ValueError):
        return None
    if bad_records or table.num_rows == 0:
        return None
    return table.to_pandas(types_mapper={pa.string(): _CELL_DTYPE}.get)


def decode_text(raw: bytes, offset: int = 0) -> str:
    """The bytes as UTF-8 text; refused with the offset (in the file) of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(None, f"the file is not UTF-8 text (first bad byte at offset {offset + exc.start})") from None


def column_names(text: str, source: SourceSpec) -> list[str]:
    """The CSV's column names: its header line, or the spec's ``columns``; duplicates refused."""
    header = None if not source.header else _header(text, source.delimiter)
    names = header if header is not None else list(source.columns or [])
    _refuse_duplicates(names)
    return names


def parse_csv_text(text: str, source: SourceSpec, names: list[str], skip_header: bool) -> pd.DataFrame:
    """Records of CSV text (a whole file, or a piece of one that starts and ends with a record) as
    exact cell texts. Raises pandas' ``EmptyDataError`` for text without a record."""
    try:
        return pd.read_csv(
            io.StringIO(text),
            sep=source.delimiter,
            header=None,
            names=names,
            skiprows=1 if skip_header else 0,
            on_bad_lines="error",
            skip_blank_lines=True,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
        )
    except pd.errors.ParserError as exc:
        # pandas' message gives a line number and field counts, never a value.
        raise InputError(None, f"malformed CSV: {exc}".strip()) from None


def short_records(raw: bytes, source: SourceSpec, names: list[str], skip_header: bool) -> list[int | None]:
    """Line numbers (within ``raw``) of the records with fewer fields than the header.

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
            read_options=arrow_csv.ReadOptions(column_names=names, skip_rows=1 if skip_header else 0, use_threads=False),
            parse_options=arrow_csv.ParseOptions(delimiter=source.delimiter, newlines_in_values=True, invalid_row_handler=note),
            convert_options=arrow_csv.ConvertOptions(column_types={name: pa.string() for name in names}),
        )
    except pa.ArrowInvalid:
        return []  # pandas has already parsed the file; its verdict stands
    return short


def refuse_short_records(short: list[int | None], count: int | None = None) -> None:
    """Refuse a table with short records: their number (``count``, default ``len(short)``) and the first line."""
    count = len(short) if count is None else count
    if count:
        where = f" (first at line {short[0]})" if short and short[0] is not None else ""
        raise InputError(
            None, f"{count} record(s) have fewer fields than the header{where}; the file may be truncated"
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
    """The Parquet table with its Arrow types kept: each column an ``ArrowDtype`` over the Arrow data."""
    try:
        table = pq.read_table(io.BytesIO(raw))
    except Exception as exc:  # pyarrow raises many types; none carries data values worth keeping
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    return arrow_frame(table)


def arrow_frame(table: pa.Table) -> pd.DataFrame:
    """A Parquet table (or a piece of one) as a frame with its Arrow types kept.

    ``types_mapper`` takes precedence over pandas' own metadata, so a dictionary column stays a
    dictionary (not a Categorical) and a nullable integer stays an integer (not a float).
    """
    refuse_invalid_columns(table)
    try:
        frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    except Exception as exc:  # see _parse_parquet
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    _refuse_duplicates([str(c) for c in frame.columns])
    return frame.reset_index(drop=True)


def refuse_invalid_columns(table: pa.Table) -> None:
    """Refuse, naming the column, a Parquet column whose data Arrow did not check on reading.

    Arrow reads a string column's bytes as they are; text that is not valid UTF-8 would only fail
    later, deep inside a stage, with a message that names no column. A full validation here checks
    every value's bytes (and offsets) once, before anything else uses them. The message names the
    column and the problem, never a value.
    """
    for name, column in zip(table.column_names, table.columns):
        try:
            column.validate(full=True)
        except pa.ArrowInvalid as exc:
            problem = "holds text that is not valid UTF-8" if "utf" in str(exc).lower() else "holds malformed data"
            raise InputError(str(name), f"{problem} (Parquet column data does not validate)") from None


def dataset_files(folder: Path) -> list[Path]:
    """The Parquet files of a dataset folder, in the order of their names (hidden ones left out)."""
    try:
        files = sorted(
            path for path in folder.iterdir()
            if path.is_file() and path.suffix.lower() == ".parquet" and not path.name.startswith((".", "_"))
        )
    except OSError as exc:
        raise InputError(None, f"cannot read {str(folder)!r} ({exc.strerror})") from None
    if not files:
        raise InputError(None, f"the folder {str(folder)!r} holds no .parquet file")
    return files


def dataset_fingerprint(entries, key: bytes | None = None) -> str:
    """The fingerprint of a dataset: the keyed hash over each (name, bytes) in order (module docstring).

    ``entries``: (file name, iterable of byte blocks, length) triples, so large files are hashed as they
    stream; ``key``: the fingerprint key (default: the installation's).
    """
    digest = source_hasher(key)
    for name, blocks, length in entries:
        digest.update(name.encode("utf-8") + b"\0" + int(length).to_bytes(8, "big"))
        for block in blocks:
            digest.update(block)
    return digest.hexdigest()


def same_schema(schemas: list[pa.Schema]) -> None:
    """Refuse a dataset whose files differ in column names or types (metadata aside)."""
    first = schemas[0]
    if any(not schema.equals(first, check_metadata=False) for schema in schemas[1:]):
        raise InputError(None, "the dataset's files differ in their columns or types")


def _read_dataset(folder: Path) -> SourceTable:
    """A Parquet dataset folder in memory: its files one after the other, as one table."""
    files = dataset_files(folder)
    contents = [read_file_bytes(path) for path in files]
    digest = dataset_fingerprint((path.name, [raw], len(raw)) for path, raw in zip(files, contents))
    try:
        tables = [pq.read_table(io.BytesIO(raw)) for raw in contents]
    except Exception as exc:  # see _parse_parquet
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    same_schema([table.schema for table in tables])
    table = pa.concat_tables([table.replace_schema_metadata(tables[0].schema.metadata) for table in tables])
    frame = arrow_frame(table)
    if frame.empty:
        raise InputError(None, "the table has no records")
    return SourceTable(frame=frame, sha256=digest, rows=len(frame), size=sum(len(raw) for raw in contents))


@task(name="ingest", cache_policy=NO_CACHE, persist_result=False)
def ingest_source(source: SourceSpec) -> SourceTable:
    """Prefect task: read and fingerprint the source."""
    return read_source(source)
