"""Checks that need no noise and run before ε is reserved: the release id, and where the files will go.

A release must not fail after its noise is drawn for a reason that could be known earlier. So before
the reservation the flow asks the audit store whether the release id is already published (the same
logical release: a rerun that has nothing to do; another one: refused), and checks the output folder:
it is, or can be made, a writable folder, on a file system with room for twice the expected output,
and the process's file-size limit (``ulimit -f``) admits the expected data file. Nothing is created
under the release's final name here.
"""

import json
import os
import resource
import shutil
import sqlite3
import tempfile
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from kepsilon.audit.errors import unavailable
from kepsilon.audit.store import open_store

from .errors import SpecError
from .publish import (
    AlreadyPublished,
    put_in_place,
    refuse_existing,
    release_directory,
    staged_outputs,
    staging_directory,
)

# The room asked for, as a multiple of the expected output: staging and a rerun's re-staging may
# briefly coexist with the leftovers of an interrupted attempt.
ROOM_FACTOR = 2


def expected_output_bytes(source_bytes: int) -> tuple[int, int]:
    """(largest file, all files) a release of a source of ``source_bytes`` is expected to write.

    The published CSV holds fewer columns than the source (identifiers removed) and generalised or
    rounded values, so it is taken as at most the source's size; the Parquet file, compressed, the
    same again at most; the manifest is a few kilobytes.
    """
    per_file = max(int(source_bytes), 1) + 64 * 1024
    return per_file, 2 * per_file


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def check_output_dir(output_dir: str | Path, release_id: str, source_bytes: int) -> Path:
    """Refuse (``SpecError('output_dir')``) unless the release can be written where the spec says.

    The folder must be, or be made, a writable folder (tried by creating and removing a hidden probe
    file: permission bits alone say nothing for root or read-only mounts), with ``ROOM_FACTOR`` times
    the expected output free, and a file-size limit above the largest expected file. A folder under
    the release's final name is refused as ``AlreadyPublished``. Returns the folder, absolute.
    """
    folder = Path(output_dir).absolute()
    existing = _nearest_existing(folder)
    if existing != folder and not existing.is_dir():
        raise SpecError("output_dir", f"{str(folder)!r} cannot be made: {str(existing)!r} is a file, not a folder")
    if existing == folder and not folder.is_dir():
        raise SpecError("output_dir", f"{str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".kepsilon-probe-", dir=folder)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise SpecError("output_dir", f"{str(folder)!r} is not writable ({error.strerror or type(error).__name__})") from None
    refuse_existing(release_directory(folder, release_id))
    largest, total = expected_output_bytes(source_bytes)
    free = shutil.disk_usage(folder).free
    if free < ROOM_FACTOR * total:
        raise SpecError(
            "output_dir",
            f"{str(folder)!r} has {free:,} bytes free; this release needs {ROOM_FACTOR * total:,} "
            f"({ROOM_FACTOR} × its expected output of {total:,} bytes, estimated from the source's size)",
        )
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and limit < largest:
        raise SpecError(
            "output_dir",
            f"this process may write files of at most {limit:,} bytes (ulimit -f); the release's data file is "
            f"expected to reach {largest:,} bytes",
        )
    return folder


@task(name="check-output", cache_policy=NO_CACHE, persist_result=False)
def check_output(output_dir: str, release_id: str, source_bytes: int) -> str:
    """Prefect task: ``check_output_dir``; returns the absolute output folder."""
    return str(check_output_dir(output_dir, release_id, source_bytes))


def published_record(store: str, release_id: str, key: str) -> dict | None:
    """The private record of this logical release if it is already published, else None.

    Refuses with ``AlreadyPublished`` when the release id was published by *another* logical release
    (another idempotency key): published releases are immutable, and this is known before any ε.
    """
    db = open_store(store)
    try:
        found = db.execute(
            "SELECT idempotency_key, manifest FROM releases WHERE release_id = ? AND outcome = 'published' ORDER BY id",
            (release_id,),
        ).fetchall()
    except sqlite3.Error as error:
        raise unavailable(store, error, "read") from None
    finally:
        db.close()
    if not found:
        return None
    for stored_key, manifest in reversed(found):
        if stored_key == key:
            return json.loads(manifest)
    raise AlreadyPublished(
        f"release {release_id!r} is already published with other parameters or data; "
        "published releases are immutable, so give this one a new release_id"
    )


def complete_publication(record: dict) -> tuple[Path, bool]:
    """Finish a published release whose staging folder was not yet renamed (a crash after its record).

    Returns (final folder, whether it is there now). The staging folder is renamed only if its files
    are the ones the record lists; nothing is rewritten and nothing is recorded.
    """
    final = Path(record.get("output_dir") or record.get("directory") or "")
    if not final.name:
        return final, False
    staging = staging_directory(final.parent, final.name)
    if not final.exists() and staging.is_dir() and staged_outputs(staging) == record.get("outputs"):
        put_in_place(staging, final)
    return final, final.is_dir()


@task(name="already-published", cache_policy=NO_CACHE, persist_result=False)
def find_published(store: str, release_id: str, key: str) -> dict | None:
    """Prefect task: this logical release's record if it is published (its folder completed if needed)."""
    record = published_record(store, release_id, key)
    if record is None:
        return None
    final, present = complete_publication(record)
    return {**record, "already_published": True, "published_at": str(final), "folder_present": present}
