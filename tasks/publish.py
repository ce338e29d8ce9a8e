"""Publish: shuffle the released records and write them with their manifest (method.md §2, steps 6–7).

Layout: ``<output_dir>/<release_id>/data.csv``, ``data.parquet`` and ``manifest.json``. Publication is
two steps, with the audit record committed between them (``flows/release.py``):

1. ``stage``: the three files are written, flushed and fsynced into a hidden staging folder beside
   the final one, ``<output_dir>/.<release_id>.staging`` (same file system), manifest last;
2. ``put_in_place``: once the store holds the release's record, the staging folder is renamed to the
   release's final name in one atomic step.

So a folder under a release's final name always has its audit record, and a reader never sees a
half-written release: before the rename there is nothing under that name. A crash before the record
leaves only the hidden staging folder, which the rerun rebuilds; a crash between record and rename is
completed by the rerun (``complete_publication``). Files get ordinary read permissions (0666 and
folders 0777, less the umask: 0644 and 0755 with the usual 022).

Values leave as they came. ``data.csv`` holds each cell's text (``values.cell_texts``): text exactly
as read, quoted where a CSV reader would otherwise split or merge it; ``data.parquet`` holds every
column in its published type (``values.published_type``): text as ``large_string``, the noisy
ε-quasis as ``double``, a column read from Parquet in the Arrow type it was read with.

A published release is immutable: nothing is staged when its final name already exists.
"""

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.engine.stages import published_table
from kepsilon.faults import fault_point
from kepsilon.record import PublicationEntries, PublicManifest

from .errors import KepsilonError
from .values import cell_text_array, csv_encoding, published_type

DATA_CSV = "data.csv"
DATA_PARQUET = "data.parquet"
MANIFEST = "manifest.json"


class AlreadyPublished(KepsilonError):
    """The release id was already published by another logical release."""


@dataclass(frozen=True)
class Publication:
    """Where a release was published and the fingerprints of its files."""

    directory: Path  # the final folder
    outputs: dict[str, str]  # file name -> SHA-256
    staging: Path | None = None  # where it is staged until the audit record is committed

    def report(self) -> PublicationEntries:
        return {"directory": str(self.directory), "outputs": dict(self.outputs)}


def release_directory(output_dir: str | Path, release_id: str) -> Path:
    return Path(output_dir) / release_id


def staging_directory(output_dir: str | Path, release_id: str) -> Path:
    """The hidden folder a release is staged in: beside the final one, so renaming it is atomic."""
    return Path(output_dir) / f".{release_id}.staging"


def refuse_existing(directory: Path) -> None:
    """Refuse to stage or rename over a release folder that already exists (published releases are immutable)."""
    if directory.exists() or directory.is_symlink():
        raise AlreadyPublished(
            f"release {directory.name!r}: a folder of that name already exists in {str(directory.parent)!r}; "
            "published releases are immutable, so give this one a new release_id"
        )


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """The CSV form of the release: comma-separated, a header, ``\n`` after every record, UTF-8.

    Each cell is its text (``cell_texts``; floats at full precision, grid values are exact), written
    byte for byte. A cell is quoted (RFC 4180: in ``"``, inner ``"`` doubled) when it holds a comma, a
    quote, ``\n`` or ``\r`` — Python's csv writer, which pandas uses, leaves a lone ``\r`` unquoted, and
    a reader then ends the record there. A missing value is an empty cell; a record that is one empty
    cell is written ``""`` so it is not a blank line.
    """
    return csv_header(frame) + csv_records(frame)


def csv_header(frame: pd.DataFrame) -> bytes:
    """The header line of ``data.csv`` (with its ``\n``)."""
    names = _csv_fields(pa.array([str(name) for name in frame.columns], type=pa.large_string()))
    return (",".join(names.to_pylist()) + "\n").encode("utf-8")


def csv_records(frame: pd.DataFrame) -> bytes:
    """The records of ``data.csv``, each ending in ``\n``: a partitioned release writes its parts with it
    and joins them after the header, byte for byte what :func:`csv_bytes` writes for the whole table.

    The fields are quoted and joined by Arrow's string kernels, not one Python string per cell (500,000
    records of eight columns: 6.4–6.8 s of CPU cell by cell, 0.9 s here).
    """
    if len(frame) == 0 or len(frame.columns) == 0:
        return b""
    fields = [_csv_fields(cell_text_array(frame[name])) for name in frame.columns]
    if len(fields) == 1:  # a record that is one empty cell is written "", so it is not a blank line
        fields = [pc.if_else(pc.equal(fields[0], ""), _text('""'), fields[0])]
    records = pc.binary_join_element_wise(*fields, _text(","))
    lines = pc.binary_join_element_wise(records, _text(""), _text("\n"))  # each record, then its "\n"
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset: lines.offset + len(lines) + 1]
    return lines.buffers()[2][int(offsets[0]): int(offsets[-1])].to_pybytes()


def _csv_fields(texts: pa.Array) -> pa.Array:
    """Each text as a CSV field (RFC 4180): in ``"``, inner ``"`` doubled, where it holds a comma, a quote,
    ``\n`` or ``\r``; a missing value is an empty field. A dictionary's distinct texts are quoted once."""
    if isinstance(texts, pa.DictionaryArray):
        return _csv_fields(texts.dictionary).take(texts.indices).fill_null("")
    special = pc.match_substring_regex(texts, r'[,"\n\r]')
    if not pc.any(special).as_py():
        return texts.fill_null("")
    quoted = pc.binary_join_element_wise(_text('"'), pc.replace_substring(texts, '"', '""'), _text('"'), _text(""))
    return pc.if_else(special, quoted, texts).fill_null("")


def _text(value: str) -> pa.Scalar:
    return pa.scalar(value, type=pa.large_string())


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    """The Parquet form of the release: each column in its published type (``published_type``).

    A dictionary column is re-encoded over the published values only (``_compact_dictionary``): the
    source's dictionary may list values that only suppressed or unpublished records hold.
    """
    schema = pa.schema([pa.field(str(name), published_type(frame[name])) for name in frame.columns])
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    for position, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(position, field, _compact_dictionary(table.column(position), field.type))
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def _compact_dictionary(column: pa.ChunkedArray, data_type: pa.DictionaryType) -> pa.Array:
    """The column over a dictionary of the values it holds, in the same Arrow type.

    Unordered: entries in order of first appearance in the published (shuffled) records, so the
    dictionary says nothing about the source's order. Ordered: the source's order, which is the
    declared meaning of the categories, restricted to the values published.
    """
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not data_type.ordered:
        return array.dictionary_decode().dictionary_encode().cast(data_type)
    indices = array.indices.to_numpy(zero_copy_only=False)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    used = np.zeros(len(array.dictionary), dtype=bool)
    used[indices[valid].astype(np.int64)] = True
    new_index = np.cumsum(used) - 1
    remapped = pa.array(
        np.where(valid, new_index[np.where(valid, indices, 0).astype(np.int64)], 0),
        type=data_type.index_type,
        mask=~valid,
    )
    return pa.DictionaryArray.from_arrays(remapped, array.dictionary.filter(pa.array(used)), ordered=True)


def published_columns(frame: pd.DataFrame, roles: dict[str, list[str]]) -> dict:
    """Each published column's role and published type, for the public manifest.

    The type is the column's dtype read from the source's declared schema (text for a CSV), or the
    type the method gives it (k-quasi labels are text, noisy ε-quasis ``double``): it is read from
    no record, so it cannot depend on a suppressed one. ``csv_encoding`` names how data.csv writes a
    column whose text is not the value itself (base64 for bytes).
    """
    role_of = {column: role for role, columns in roles.items() for column in columns}
    described = {}
    for name in frame.columns:
        entry = {"role": role_of[name], "type": str(published_type(frame[name]))}
        encoding = csv_encoding(frame[name].dtype)
        if encoding:
            entry["csv_encoding"] = encoding
        described[str(name)] = entry
    return described


def write_file(path: Path, content: bytes) -> str:
    """Create ``path`` (it must not exist), write and fsync ``content``; return its SHA-256.

    Created with mode 0666 less the umask (an ordinary readable file), not a temp file's 0600: the
    staging folder is hidden, and the whole folder becomes visible in one rename.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    return hashlib.sha256(content).hexdigest()


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def stage(frame: pd.DataFrame, manifest: PublicManifest, output_dir: str | Path) -> Publication:
    """Write data.csv, data.parquet, then manifest.json (with the data files' SHA-256) into the staging folder.

    ``manifest`` is the *public* manifest (``flows.manifest.public_manifest``, a ``PublicManifest``): it is written as given,
    plus the output hashes. A staging folder left by an interrupted attempt is replaced: it is hidden,
    and the rerun re-derives the same bytes from the sealed seed. Nothing is created under the final name.
    """
    final = release_directory(output_dir, manifest["release_id"])
    refuse_existing(final)
    staging = staging_directory(output_dir, manifest["release_id"])
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    contents = {DATA_CSV: csv_bytes(frame), DATA_PARQUET: parquet_bytes(frame)}
    outputs = {}
    for name, content in contents.items():
        outputs[name] = write_file(staging / name, content)
        fault_point("after-staging")
    fault_point("before-manifest")
    write_file(staging / MANIFEST, manifest_bytes({**manifest, "outputs": outputs}))
    _fsync_directory(staging)
    _fsync_directory(staging.parent)
    return Publication(directory=final, outputs=outputs, staging=staging)


def put_in_place(staging: Path, final: Path) -> None:
    """Rename the complete staging folder to the release's final name, atomically and durably."""
    refuse_existing(final)
    os.rename(staging, final)
    _fsync_directory(final.parent)


def staged_outputs(staging: Path) -> dict[str, str] | None:
    """SHA-256 of the data files in a staging folder whose manifest was written, or None if incomplete."""
    try:
        manifest = json.loads((staging / MANIFEST).read_text(encoding="utf-8"))
        recorded = manifest["outputs"]
        actual = {name: hashlib.sha256((staging / name).read_bytes()).hexdigest() for name in recorded}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return actual if actual == recorded else None


def publish(frame: pd.DataFrame, manifest: PublicManifest, output_dir: str | Path) -> Publication:
    """Stage and put in place in one go (for callers without an audit record to commit in between)."""
    publication = stage(frame, manifest, output_dir)
    if publication.staging is None:  # stage() always names its staging folder
        raise RuntimeError("the release was not staged")
    put_in_place(publication.staging, publication.directory)
    return publication


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=_jsonable) + "\n").encode("utf-8")


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


@task(name="stage", cache_policy=NO_CACHE, persist_result=False)
def stage_release(frame: pd.DataFrame, manifest: PublicManifest, output_dir: str) -> Publication:
    """Prefect task: write the release files and manifest to the hidden staging folder."""
    return stage(frame, manifest, output_dir)


@task(name="merge-and-shuffle", cache_policy=NO_CACHE, persist_result=False)
def merge_and_shuffle(partition, kept: pd.DataFrame, class_ids, noisy: pd.DataFrame, removed: np.ndarray,
                      order: np.ndarray, roles: dict) -> pd.DataFrame:
    """Prefect task: the stage sequence's ``merge`` step (``kepsilon.engine.stages.published_table``): the
    release table, shuffled, without suppressed records.

    The k-quasi labels are computed there, after the last suppression stage, from the published
    records only (``published_labels``), so no label depends on a suppressed record.
    """
    return published_table(partition, kept, class_ids, noisy, removed, order, roles)


@task(name="move-into-place", cache_policy=NO_CACHE, persist_result=False)
def move_into_place(staging: Path, final: Path) -> None:
    """Prefect task: rename the staged release to its final name (after its audit record is committed)."""
    put_in_place(staging, final)
