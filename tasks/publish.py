"""Publish: shuffle the released records and write them atomically with their manifest (method.md §2, steps 6–7).

Layout: ``<output_dir>/<release_id>/data.csv``, ``data.parquet`` and ``manifest.json``. Each file is
written under a temporary name in the same folder, flushed to disk and renamed over its final name,
so a reader never sees a half-written file. The manifest goes last: its presence means the release is
complete, and it carries the SHA-256 of both data files.

Values leave as they came. ``data.csv`` holds each cell's text (``values.cell_texts``): text exactly
as read, quoted where a CSV reader would otherwise split or merge it; ``data.parquet`` holds every
column in its published type (``values.published_type``): text as ``large_string``, the noisy
ε-quasis as ``double``, a column read from Parquet in the Arrow type it was read with.

A published release is immutable: publishing another logical release (another idempotency key) under
a release id that already has a manifest is refused. Re-publishing the same logical release (a rerun
after a crash) rewrites byte-identical files.
"""

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.faults import fault_point

from .errors import KepsilonError
from .k_anonymise import published_labels
from .values import cell_texts, csv_encoding, published_type

DATA_CSV = "data.csv"
DATA_PARQUET = "data.parquet"
MANIFEST = "manifest.json"


class AlreadyPublished(KepsilonError):
    """The release id was already published by another logical release."""


@dataclass(frozen=True)
class Publication:
    """Where a release was published and the fingerprints of its files."""

    directory: Path
    outputs: dict[str, str]  # file name -> SHA-256

    def report(self) -> dict:
        return {"directory": str(self.directory), "outputs": dict(self.outputs)}


def shuffle_records(frame: pd.DataFrame, order: np.ndarray) -> pd.DataFrame:
    """The records in the order given by ``order`` (a permutation), with a fresh 0..n-1 index.

    Mondrian and sorting leave records grouped by class and by value; publishing them in that order
    would let an attacker match rows by position, so release order comes from the release's random
    source (which keeps a rerun from the escrowed seed byte-identical).
    """
    if len(order) != len(frame) or not np.array_equal(np.sort(order), np.arange(len(frame))):
        raise ValueError("order must be a permutation of the frame's rows")
    return frame.iloc[order].reset_index(drop=True)


def release_directory(output_dir: str | Path, release_id: str) -> Path:
    return Path(output_dir) / release_id


def check_publishable(directory: Path, outputs: dict[str, str]) -> None:
    """Refuse to overwrite a release published under the same id with other content.

    A rerun of the same logical release re-derives its noise from the sealed seed, so its data files
    are byte-identical and their hashes match the published manifest's; anything else is another
    release. (The comparison uses only the public output hashes: the published manifest carries no
    key derived from the private source.)
    """
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        return
    try:
        published_outputs = json.loads(manifest_path.read_text(encoding="utf-8")).get("outputs")
    except (OSError, ValueError):
        published_outputs = None
    if published_outputs != outputs:
        raise AlreadyPublished(
            f"release {directory.name!r} is already published with other parameters or data; "
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
    columns = [[_csv_field(text) for text in cell_texts(frame[name])] for name in frame.columns]
    header = ",".join(_csv_field(str(name)) for name in frame.columns)
    if len(frame.columns) == 1:
        columns = [[field or '""' for field in columns[0]]]
    records = [",".join(fields) for fields in zip(*columns)]
    return ("\n".join([header, *records]) + "\n").encode("utf-8")


def _csv_field(text: str | None) -> str:
    if text is None:
        return ""
    if any(special in text for special in (",", '"', "\n", "\r")):
        return '"' + text.replace('"', '""') + '"'
    return text


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


def write_atomically(path: Path, content: bytes) -> str:
    """Write ``content`` to ``path`` via a temporary file and a rename; return its SHA-256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        fault_point("after-staging")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return hashlib.sha256(content).hexdigest()


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish(frame: pd.DataFrame, manifest: dict, output_dir: str | Path) -> Publication:
    """Write data.csv, data.parquet, then manifest.json (with the data files' SHA-256), each atomically.

    ``manifest`` is the *public* manifest (``flows.manifest.public_manifest``): it is written as given,
    plus the output hashes; where the files went is returned, not published.
    """
    directory = release_directory(output_dir, manifest["release_id"])
    contents = {DATA_CSV: csv_bytes(frame), DATA_PARQUET: parquet_bytes(frame)}
    check_publishable(directory, {name: hashlib.sha256(content).hexdigest() for name, content in contents.items()})
    outputs = {name: write_atomically(directory / name, content) for name, content in contents.items()}
    fault_point("before-manifest")
    complete = {**manifest, "outputs": outputs}
    write_atomically(directory / MANIFEST, manifest_bytes(complete))
    remove_stale_temporaries(directory)
    return Publication(directory=directory, outputs=outputs)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temp files a crashed earlier attempt left behind (hidden, but a full copy of the data).

    Runs only once the release is complete: its files are in place, so no temp file is still needed.
    """
    for name in (DATA_CSV, DATA_PARQUET, MANIFEST):
        for stale in directory.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=_jsonable) + "\n").encode("utf-8")


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


@task(name="publish", cache_policy=NO_CACHE, persist_result=False)
def publish_release(frame: pd.DataFrame, manifest: dict, output_dir: str) -> Publication:
    """Prefect task: atomically publish the release files and manifest."""
    return publish(frame, manifest, output_dir)


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
    shuffled = shuffle_records(merged, order)
    return shuffled[~removed[order]].reset_index(drop=True)


@task(name="merge-and-shuffle", cache_policy=NO_CACHE, persist_result=False)
def merge_and_shuffle(partition, kept: pd.DataFrame, class_ids, perturbation, suppression, roles: dict) -> pd.DataFrame:
    """Prefect task: the release table, shuffled, without suppressed records.

    The k-quasi labels are computed here, after the last suppression stage, from the published
    records only (``published_labels``), so no label depends on a suppressed record.
    """
    released_quasis = published_labels(
        kept[roles["k_quasi"]], class_ids, ~suppression.removed, partition.hierarchies, partition.levels
    )
    return assemble_release(released_quasis, kept, perturbation.frame, suppression.removed, perturbation.order, roles)
