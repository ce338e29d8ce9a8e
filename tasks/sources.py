"""A source read in pieces, for the partitioned (Dask) release path: the plan, then one piece per task.

The plan reads the source once from start to end, in blocks (memory does not grow with its size): it
takes the same keyed fingerprint the in-memory ingest takes (of the file's bytes, or ``dataset_fingerprint``
of a folder), the column names, and where the pieces start and end. Each piece is then read on its own,
with the in-memory ingest's own parsing functions (``tasks/ingest.py``), so every cell holds the same
value on both paths:

* CSV: a piece is a range of whole records. A piece ends after a line break that is not inside a
  quoted field: the plan counts the quote characters before every line break (an even count means
  the break ends a record) — exact for files written the way RFC 4180 quotes (a quote inside a field
  only inside a quoted field, doubled). A piece's first line number in the file is kept, so a refusal
  can name the file's line.
* Parquet (a file, or a folder of files, ``ingest.dataset_files``): a piece is a range of records
  counted from the files' metadata; it may span files and cut row groups (a row group is read whole
  and sliced).

What a piece cannot see on its own — the first bad byte of the whole file, the number of short records,
the whole table's emptiness — each piece reports, and the flow refuses as the in-memory ingest would:
the first error in file order, counts added up.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kepsilon.audit.fingerprint import source_hasher
from kepsilon.spec import SourceFormat, SourceSpec

from .errors import InputError
from .ingest import (
    _BOM,
    arrow_csv_cells,
    arrow_frame,
    column_names,
    dataset_files,
    dataset_fingerprint,
    decode_text,
    parse_csv_text,
    same_schema,
    short_records,
)

CSV_PIECE_BYTES = 64 << 20  # default piece of a CSV: 64 MiB (about 550,000 records of the sample's shape)
# Default piece of a Parquet source. Each hop between the Dask engine's stages is a scratch file per pair of pieces,
# so the files grow with the square of the pieces: a 30M-row fine release in 500,000-record pieces (60) spent 7.62 us
# of worker CPU per record, in 1,000,000-record pieces (30) 5.93 us, its workers peaking at 660-699 and 862-868 MB
# (docs/performance.md). A table that fills fewer pieces than the cluster has threads is cut finer, down to
# SMALLEST_PARQUET_PIECE_ROWS a piece, so that every thread has one (``parquet_pieces``).
PARQUET_PIECE_ROWS = 1_000_000
SMALLEST_PARQUET_PIECE_ROWS = 250_000
_BLOCK = 8 << 20  # bytes read at a time by the plan
_NEWLINE, _QUOTE = 10, 34


@dataclass(frozen=True)
class Piece:
    """One piece of the source. CSV: ``segments`` is one (start byte, end byte) pair and ``first_line``
    the file's line number of its first line. Parquet: (file number, first record, end record) triples,
    with ``start_row`` the source position of its first record."""

    index: int
    segments: tuple
    first_line: int = 1
    start_row: int | None = None


@dataclass(frozen=True)
class SourcePlan:
    """How the source is read in pieces, and what the in-memory ingest would record of it."""

    format: str  # "csv" or "parquet"
    files: tuple[str, ...]
    names: tuple[str, ...]
    pieces: tuple[Piece, ...]
    sha256: str  # the keyed fingerprint (HMAC-SHA256, ``audit/fingerprint.py``), under its historical name
    size: int  # bytes of the source files
    memory_bytes: int  # the table's size in memory, estimated (sizes the output-folder check)
    rows: int | None = None  # known before reading for Parquet

    def report(self) -> dict:
        """What the audit record keeps of the source (as ``SourceTable.report``): never its content."""
        return {"sha256": self.sha256, "columns": len(self.names)}


def plan_source(source: SourceSpec, partitions: int | None, threads: int = 1) -> SourcePlan:
    """The plan of the source named by the spec, in ``partitions`` pieces (default: by size; for Parquet, at
    least ``threads`` pieces where the table has records enough, ``parquet_pieces``)."""
    if source.resolved_format() is SourceFormat.parquet:
        return _plan_parquet(source, partitions, threads)
    return _plan_csv(source, partitions)


def parquet_pieces(records: int, partitions: int | None = None, threads: int = 1) -> int:
    """How many pieces a Parquet source of ``records`` records is cut into: ``partitions`` where the spec gives
    them, else one per ``PARQUET_PIECE_ROWS`` records, but as many as the cluster's ``threads`` where each piece
    still holds ``SMALLEST_PARQUET_PIECE_ROWS`` records; never more pieces than records, never none. The plan
    and the workers' memory estimate both count them here."""
    wanted = partitions or max(math.ceil(records / PARQUET_PIECE_ROWS),
                               min(max(threads, 1), records // SMALLEST_PARQUET_PIECE_ROWS))
    return min(max(wanted, 1), max(records, 1))


# --------------------------------------------------------------------------- CSV


def _plan_csv(source: SourceSpec, partitions: int | None) -> SourcePlan:
    path = Path(source.path)
    try:
        size = path.stat().st_size
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(None, f"cannot read {str(path)!r} ({exc.strerror})") from None
    wanted = partitions or max(1, math.ceil(size / CSV_PIECE_BYTES))
    targets = [size * number // wanted for number in range(1, wanted)]
    digest = source_hasher()
    boundaries: list[tuple[int, int]] = []  # (byte where a piece starts, line breaks before it)
    head, head_done = bytearray(), False
    quotes_before = newlines_before = position = 0
    with handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
            if not head_done:
                cut = block.find(b"\n")
                head += block if cut < 0 else block[:cut]
                head_done = cut >= 0
            data = np.frombuffer(block, dtype=np.uint8)
            newlines = np.flatnonzero(data == _NEWLINE)
            quotes = np.flatnonzero(data == _QUOTE)
            # A line break ends a record when an even number of quotes comes before it.
            ends = (quotes_before + np.searchsorted(quotes, newlines)) % 2 == 0
            starts = newlines[ends] + position + 1
            breaks_before = np.flatnonzero(ends) + newlines_before + 1
            while targets and targets[0] < position + len(block):
                at = int(np.searchsorted(starts, targets[0], side="left"))
                if at == len(starts):
                    break  # the record ends in a later block
                start = int(starts[at])
                if start < size and (not boundaries or start > boundaries[-1][0]):
                    boundaries.append((start, int(breaks_before[at])))
                targets.pop(0)
            quotes_before += len(quotes)
            newlines_before += len(newlines)
            position += len(block)
    names = column_names(decode_text(bytes(head)).removeprefix(_BOM), source)
    starts = [(0, 0), *boundaries]  # (byte offset, line breaks before it) of each piece
    ends = [start for start, _ in boundaries] + [size]
    pieces = tuple(
        Piece(index=number, segments=((start, end),), first_line=breaks + 1)
        for number, ((start, breaks), end) in enumerate(zip(starts, ends))
    )
    return SourcePlan("csv", (str(path),), tuple(names), pieces, digest.hexdigest(), size, size)


def read_csv_piece(plan: SourcePlan, piece: Piece, source: SourceSpec) -> tuple[pd.DataFrame, list[int | None]]:
    """The piece's records as exact cell texts, and the file's line numbers of its short records."""
    (start, end), = piece.segments
    with open(plan.files[0], "rb") as handle:
        handle.seek(start)
        raw = handle.read(end - start)
    text = decode_text(raw, offset=start)
    skip_header = source.header and start == 0
    if start == 0 and text.startswith(_BOM):
        text = text[len(_BOM):]
        raw = raw[len(_BOM.encode("utf-8")):]
    names = list(plan.names)
    frame = arrow_csv_cells(raw, source, names, skip_header)  # a plain CSV, straight into Arrow strings
    if frame is not None:
        return frame, []
    try:
        frame = parse_csv_text(text, source, names, skip_header=skip_header)
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame({name: pd.array([], dtype=str) for name in names})
    except InputError as error:
        if piece.index == 0:
            raise
        raise InputError(error.column, f"{error.problem} (in the piece starting at line {piece.first_line} of the file)") from None
    shift = piece.first_line - 1
    short = [None if line is None else line + shift for line in short_records(raw, source, names, skip_header)]
    return frame, short


# --------------------------------------------------------------------------- Parquet


def _plan_parquet(source: SourceSpec, partitions: int | None, threads: int = 1) -> SourcePlan:
    path = Path(source.path)
    files = dataset_files(path) if path.is_dir() else [path]
    try:
        metadata = [pq.ParquetFile(file).metadata for file in files]
        schemas = [pq.read_schema(file) for file in files]
    except OSError as exc:
        raise InputError(None, f"cannot read {str(path)!r} ({exc.strerror})") from None
    except Exception as exc:  # pyarrow raises many types; none carries data values worth keeping
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    same_schema(schemas)
    names = tuple(str(c) for c in arrow_frame(schemas[0].empty_table()).columns)
    rows = [meta.num_rows for meta in metadata]
    total = sum(rows)
    wanted = parquet_pieces(total, partitions, threads)
    cuts = [total * number // wanted for number in range(wanted + 1)]
    file_starts = np.cumsum([0, *rows])
    pieces = tuple(
        Piece(index=number, segments=_segments(cuts[number], cuts[number + 1], file_starts), start_row=cuts[number])
        for number in range(wanted)
    )
    sha256, size = _files_sha256(files, path.is_dir())
    in_memory = sum(meta.row_group(g).total_byte_size for meta in metadata for g in range(meta.num_row_groups))
    return SourcePlan("parquet", tuple(str(f) for f in files), names, pieces, sha256, size, max(size, in_memory), total)


def _segments(start: int, end: int, file_starts: np.ndarray) -> tuple:
    """The (file number, first record, end record) ranges covering records ``start`` to ``end``."""
    segments = []
    for number in range(len(file_starts) - 1):
        low, high = max(start, int(file_starts[number])), min(end, int(file_starts[number + 1]))
        if low < high:
            segments.append((number, low - int(file_starts[number]), high - int(file_starts[number])))
    return tuple(segments)


def _files_sha256(files: list[Path], dataset: bool) -> tuple[str, int]:
    """The ingest's fingerprint of a file (keyed hash of its bytes) or a dataset, read in blocks."""

    def blocks(file: Path):
        with open(file, "rb") as handle:
            while block := handle.read(_BLOCK):
                yield block

    try:
        size = sum(file.stat().st_size for file in files)
        if dataset:
            return dataset_fingerprint((f.name, blocks(f), f.stat().st_size) for f in files), size
        digest = source_hasher()
        for block in blocks(files[0]):
            digest.update(block)
        return digest.hexdigest(), size
    except OSError as exc:
        raise InputError(None, f"cannot read {str(files[0].parent)!r} ({exc.strerror})") from None


def read_parquet_piece(plan: SourcePlan, piece: Piece) -> pd.DataFrame:
    """The piece's records with their Arrow types (``ingest.arrow_frame``), row groups read whole and sliced."""
    tables = []
    try:
        for number, start, end in piece.segments:
            parquet = pq.ParquetFile(plan.files[number])
            group_rows = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
            group_starts = np.cumsum([0, *group_rows])
            first = int(np.searchsorted(group_starts, start, side="right")) - 1
            last = int(np.searchsorted(group_starts, end, side="left"))
            table = parquet.read_row_groups(list(range(first, last)))
            tables.append(table.slice(start - int(group_starts[first]), end - start))
    except Exception as exc:  # see _plan_parquet
        raise InputError(None, f"not a readable Parquet file ({type(exc).__name__})") from None
    if not tables:
        return arrow_frame(pq.read_schema(plan.files[0]).empty_table())
    metadata = tables[0].schema.metadata
    return arrow_frame(pa.concat_tables([table.replace_schema_metadata(metadata) for table in tables]))


def read_piece(plan: SourcePlan, piece: Piece, source: SourceSpec) -> tuple[pd.DataFrame, list[int | None]]:
    """The piece's records (index: their positions within the piece) and its short records (CSV)."""
    if plan.format == "csv":
        return read_csv_piece(plan, piece, source)
    return read_parquet_piece(plan, piece), []


# --------------------------------------------------------------------------- sizing the cluster

_SAMPLE_ROWS = 10_000
CSV_MEMORY_FACTOR = 1.5  # a CSV piece in Arrow: its text plus each cell's offset


def partition_memory_estimate(source: SourceSpec, partitions: int | None) -> int:
    """The Arrow size of one partition, estimated before the plan without reading the source whole.

    Parquet: the bytes per record of the first ``_SAMPLE_ROWS`` records as Arrow reads them, times the
    records of a piece (the files' metadata gives the count). CSV: a piece's bytes times
    ``CSV_MEMORY_FACTOR``. A source that cannot be read gives 0: the plan refuses it by name afterwards.
    Used to set the local workers' memory limit (``flows/cluster.py``).
    """
    path = Path(source.path)
    try:
        if source.resolved_format() is SourceFormat.parquet:
            files = dataset_files(path) if path.is_dir() else [path]
            total = sum(pq.ParquetFile(file).metadata.num_rows for file in files)
            if total == 0:
                return 0
            first = next(pq.ParquetFile(files[0]).iter_batches(batch_size=_SAMPLE_ROWS), None)
            if first is None or first.num_rows == 0:
                return 0
            pieces = parquet_pieces(total, partitions)  # threads unknown here: the largest default pieces
            return int(first.nbytes / first.num_rows * math.ceil(total / pieces))
        size = path.stat().st_size
        pieces = partitions or max(1, math.ceil(size / CSV_PIECE_BYTES))
        return int(size / pieces * CSV_MEMORY_FACTOR)
    except Exception:  # noqa: BLE001 - any unreadable source: the plan's refusal names the problem
        return 0
