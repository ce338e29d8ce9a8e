"""Claims on a release id: which live run is publishing a release right now.

Two runs of the same release started together share one reservation (same idempotency key), so the
ledger alone cannot tell "a run that died after its reservation" (its rerun must resume the
reservation) from "a run still working on it" (a second run must keep out, or it records a failure
and an unseal against a release the first one is publishing). A claim is an exclusive ``flock`` on a
file named after the release id, held for the whole run: the kernel drops it when its process ends,
however it ends (SIGKILL included), so a held claim always means a live owner, and a reservation
without a held claim is one a rerun may resume.

The claim files live in ``<store>.claims/`` beside the audit store (folder 0700, files 0600). They
hold the owner's pid, host and time as a hint for the operator; the lock, not the text, decides.
They are never deleted: removing a lock file while another process opens it would let two owners in.

Limit: ``flock`` is reliable between processes of one machine on a local file system. Runs of the same
release on different machines sharing a store over a network file system are not kept apart by it
(nor is SQLite's own locking reliable there).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from kepsilon.audit.private import private_folder
from kepsilon.tasks.errors import KepsilonError


class ReleaseInProgress(KepsilonError):
    """Another live run holds the release id's claim: this run stops before it reads, reserves or records anything."""

    def __init__(self, release_id: str):
        super().__init__(
            f"release {release_id!r} is already being published by another run; nothing done here "
            "(no record, no ε): wait for it to finish, then rerun to see where it was published"
        )


def claims_folder(store: str | Path) -> Path:
    """The folder of claim files for the store at ``store``: ``<store>.claims`` beside it."""
    path = Path(store).resolve()
    return path.with_name(path.name + ".claims")


def claim_file(store: str | Path, release_id: str) -> Path:
    """The claim file of ``release_id`` (named by a hash: a release id may hold any character)."""
    digest = hashlib.sha256(release_id.encode("utf-8")).hexdigest()[:32]
    return claims_folder(store) / f"{digest}.lock"


def _open_claim_file(path: Path) -> int:
    """Open (creating 0600 in a 0700 folder) the claim file; a store folder we cannot write is refused in one line.

    The claim is taken before the store is first opened, so on a fresh machine the store's own folder (the
    default ``./.kepsilon``) does not exist yet: it is made here as the store would make it, 0700 with its
    parents, and refused, as the store refuses it, when others can write to it.
    """
    private_folder(path.parent.parent, "KEPSILON_AUDIT_DB")  # the store's folder
    private_folder(path.parent, "KEPSILON_AUDIT_DB")  # its claims folder beside the store
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise KepsilonError(
            f"parameter 'KEPSILON_AUDIT_DB': cannot create the release claim file in {str(path.parent)!r} "
            f"({error.strerror or type(error).__name__})"
        ) from None


def _note_owner(descriptor: int) -> None:
    """Write who holds the claim (pid, host, time) into its file, for an operator who looks."""
    note = f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).isoformat()}\n"
    with contextlib.suppress(OSError):  # the note is a courtesy; the lock already decides
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, note.encode("utf-8"), 0)


@contextlib.contextmanager
def release_claim(store: str | Path, release_id: str) -> Iterator[None]:
    """Hold ``release_id``'s claim for the duration of the block; ``ReleaseInProgress`` if a live run holds it.

    Never waits: a second run is told at once rather than queued behind a release that may take hours.
    The claim is per open file, so two runs in one process (a worker serving several flow runs) keep
    each other out as two processes do.
    """
    descriptor = _open_claim_file(claim_file(store, release_id))
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReleaseInProgress(release_id) from None
        _note_owner(descriptor)
        yield
    finally:
        os.close(descriptor)  # closing drops the lock
