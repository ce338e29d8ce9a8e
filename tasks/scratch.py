"""The Dask engine's scratch folder: private, encrypted, owned by one live run, swept when a run died.

Between the Dask stages, pieces of records go through a folder on disk (``tasks/partitioned.py``). They
are raw microdata, so:

- **Where**: ``<base>/kepsilon-scratch-<uid>/<release id>-<random>/``, where ``<base>`` is the spec's
  ``execution.scratch`` or, by default, the system's temporary folder (``TMPDIR``, else ``/tmp``) —
  never the output folder (refused there, either way). Every folder it creates is 0700 and every file
  0600, set explicitly (whatever the umask); the per-account folder must belong to the account running
  the release and is made 0700 if it was not.
- **Encrypted**: every piece is sealed with AES-256-GCM under a key drawn per run (:class:`ScratchKey`),
  held only in memory by the flow and handed to its workers as a task input (Prefect records a task
  input's type, never its value; the key's ``repr`` withholds it). A killed run's leftovers are ciphertext
  whose key died with the run. Each chunk is bound to its file's name and position and to whether it is the
  last, so pieces cannot be swapped, reordered, cut short or lengthened unnoticed.
- **Owned**: the run folder holds a marker (``.kepsilon-scratch``: release id, start time, process id,
  host — no data) on which the flow keeps an exclusive ``flock`` until the run ends. The kernel drops the
  lock when the process dies, however it dies, so "marker present and lock free" means "left by a dead
  run". :func:`sweep_leftover_scratch` (called at the start of every release, any engine, any id) removes
  exactly those folders, and the pre-encryption layout ``OUTPUT_DIR/.<release id>.scratch`` of older
  versions, and says so in one line. A live run's folder (lock held) is never touched, so a concurrent
  Dask release keeps its scratch.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pickle
import shutil
import socket
import stat
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .errors import SpecError

ROOT_PREFIX = "kepsilon-scratch-"
MARKER = ".kepsilon-scratch"
MAGIC = b"KEPSILON-SCRATCH-AESGCM-1\n"
CHUNK = 4 * 1024 * 1024  # plaintext bytes per sealed chunk: bounds the memory sealing adds
_NONCE = 12
_LEGACY_PARTS = {"classified", "hashes", "shuffle", "ordered", "csv"}


# --------------------------------------------------------------------------- the key


class ScratchKey:
    """A run's AES-256-GCM key for its scratch pieces. Its ``repr`` and ``str`` withhold it; it is pickled
    only to reach the run's workers (Dask's TLS connections), never logged, recorded or written."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes):
        if len(secret) != 32:
            raise ValueError("a scratch key is 32 bytes")
        self._secret = bytes(secret)

    @classmethod
    def generate(cls) -> ScratchKey:
        return cls(os.urandom(32))

    def aead(self):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        return AESGCM(self._secret)

    def __repr__(self) -> str:
        return "ScratchKey(<withheld>)"

    __str__ = __repr__

    def __getstate__(self):
        return {"_secret": self._secret}

    def __setstate__(self, state):
        self._secret = state["_secret"]


# --------------------------------------------------------------------------- sealed files


class _SealingWriter:
    """A write-only file object that seals what it is given in ``CHUNK``-sized AES-GCM chunks.

    Layout: ``MAGIC``, then per chunk a 4-byte length, a 12-byte random nonce and the ciphertext. The
    associated data binds each chunk to the piece's name, its position and whether it is the last.
    """

    def __init__(self, handle, aead, name: bytes):
        self._handle, self._aead, self._name = handle, aead, name
        self._buffer = bytearray()
        self._count = 0
        handle.write(MAGIC)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while len(view):
            take = min(CHUNK - len(self._buffer), len(view))
            self._buffer += view[:take]
            view = view[take:]
            if len(self._buffer) == CHUNK:
                self._seal(final=False)
        return size

    def finish(self) -> None:
        self._seal(final=True)

    def _seal(self, final: bool) -> None:
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, self._buffer, _associated(self._name, self._count, final))
        self._handle.write(len(sealed).to_bytes(4, "big") + nonce)
        self._handle.write(sealed)
        self._buffer.clear()
        self._count += 1


class _OpeningReader(io.RawIOBase):
    """The plaintext of a sealed piece, chunk by chunk (raises if a chunk was altered, moved or cut off)."""

    def __init__(self, handle, aead, name: bytes):
        if handle.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a sealed scratch piece")
        self._handle, self._aead, self._name = handle, aead, name
        self._plain, self._offset, self._count, self._done = memoryview(b""), 0, 0, False
        self._header = handle.read(4 + _NONCE)

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while self._offset == len(self._plain):
            if self._done:
                return 0
            self._open_next()
        size = min(len(target), len(self._plain) - self._offset)
        target[:size] = self._plain[self._offset:self._offset + size]
        self._offset += size
        return size

    def _open_next(self) -> None:
        """Open the next chunk. It is the last exactly when no header follows it, so it is opened once, with
        that flag bound: a piece cut after any chunk, or with anything after its last, fails to open."""
        from cryptography.exceptions import InvalidTag

        header = self._header
        if len(header) < 4 + _NONCE:
            raise ValueError("a sealed scratch piece ends before its last chunk")
        sealed = self._handle.read(int.from_bytes(header[:4], "big"))
        self._header = self._handle.read(4 + _NONCE)
        final = not self._header
        try:
            self._plain = memoryview(self._aead.decrypt(header[4:], sealed, _associated(self._name, self._count, final)))
        except InvalidTag:
            raise ValueError("a sealed scratch piece does not open with this run's key") from None
        self._offset, self._done = 0, final
        self._count += 1


def _associated(name: bytes, count: int, final: bool) -> bytes:
    return MAGIC + name + b"\0" + count.to_bytes(8, "big") + (b"\1" if final else b"\0")


# --------------------------------------------------------------------------- the folder


@dataclass(frozen=True)
class Scratch:
    """A run's scratch folder and key: pickled pieces of records and counts between stages, sealed.

    Passed to the Dask tasks as an input (Prefect records its type only); ``repr`` shows the folder, not
    the key. Sub-folders are created one level at a time, 0700, and only below an existing run folder, so
    a worker that outlives its run cannot re-create a folder the sweep removed.
    """

    root: Path
    key: ScratchKey

    def __repr__(self) -> str:
        return f"Scratch({str(self.root)!r}, key=<withheld>)"

    @classmethod
    def new(cls, root: str | Path) -> Scratch:
        """A fresh, empty run folder at ``root`` (its parent must exist) with a fresh key."""
        root = Path(root)
        if root.exists() or root.is_symlink():
            shutil.rmtree(root, ignore_errors=True)
        _private_mkdir(root)
        return cls(root, ScratchKey.generate())

    def path(self, *parts) -> Path:
        return self.root.joinpath(*(str(part) for part in parts))

    def write(self, value, *parts) -> None:
        """Pickle and seal ``value`` to ``parts`` (0600, renamed into place when complete: a retried task
        overwrites its own pieces)."""
        target = self.path(*parts)
        self._folders(target.parent)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(descriptor, 0o600)
            with os.fdopen(descriptor, "wb", buffering=1024 * 1024) as handle:
                writer = _SealingWriter(handle, self.key.aead(), self._name(parts))
                pickle.dump(value, writer, protocol=5)
                writer.finish()
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def read(self, *parts):
        with open(self.path(*parts), "rb") as handle:
            reader = io.BufferedReader(_OpeningReader(handle, self.key.aead(), self._name(parts)), CHUNK)
            return pickle.load(reader)

    def exists(self, *parts) -> bool:
        return self.path(*parts).exists()

    def present(self, *prefix, count: int) -> list[int]:
        """The numbers ``i`` in ``range(count)`` whose piece ``(*prefix, i)`` exists, in increasing order: a
        stage reads what every partition (or bucket) wrote for it, and one with no records for it wrote none."""
        return [number for number in range(count) if self.exists(*prefix, number)]

    def read_present(self, *prefix, count: int) -> list:
        """Every piece ``(*prefix, i)`` that exists, ``i`` in ``range(count)``, in that order (:meth:`present`)."""
        return [self.read(*prefix, number) for number in self.present(*prefix, count=count)]

    def remove(self, *parts) -> None:
        target = self.path(*parts)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    def remove_all(self) -> None:
        if self.root.exists() or self.root.is_symlink():
            shutil.rmtree(self.root, ignore_errors=True)

    def _name(self, parts) -> bytes:
        return "/".join(str(part) for part in parts).encode("utf-8")

    def _folders(self, folder: Path) -> None:
        """Create the folders between the run folder and ``folder``, each 0700 (never the run folder)."""
        missing = []
        while folder != self.root and not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        if folder != self.root and not self.root.is_dir():
            raise FileNotFoundError(2, "the run's scratch folder is gone", str(self.root))
        for level in reversed(missing):
            _private_mkdir(level, exist_ok=True)


def _private_mkdir(path: Path, exist_ok: bool = False) -> None:
    """``mkdir`` one level, then 0700 exactly (the umask can only take bits away; this also puts none back)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not exist_ok:
            raise
        return
    os.chmod(path, 0o700)


# --------------------------------------------------------------------------- where, and whose


def scratch_base(spec) -> Path:
    """The folder the per-account scratch folder goes in: ``execution.scratch``, else the temporary folder."""
    return Path(spec.execution.scratch or tempfile.gettempdir()).resolve()


def account_root(base: Path) -> Path:
    return base / f"{ROOT_PREFIX}{os.getuid()}"


def private_root(spec, output_dir: str | Path) -> Path:
    """This account's scratch folder under the spec's base, created 0700 or checked; refused (one line,
    ``execution.scratch``) inside the output folder, or where another account owns it."""
    base = scratch_base(spec)
    published = Path(output_dir).resolve()
    if base == published or published in base.parents:
        raise SpecError("execution.scratch", "the scratch folder must not lie inside the output folder, where releases "
                                             "are published (set execution.scratch or TMPDIR elsewhere)")
    root = account_root(base)
    try:
        base.mkdir(parents=True, exist_ok=True)
        _private_mkdir(root, exist_ok=True)
        status = os.lstat(root)
    except OSError as error:
        raise SpecError("execution.scratch", f"{str(base)!r} cannot be used ({error.strerror})") from None
    if not stat.S_ISDIR(status.st_mode):
        raise SpecError("execution.scratch", f"{str(root)!r} is not a folder")
    if status.st_uid != os.getuid():
        raise SpecError("execution.scratch", f"{str(root)!r} belongs to another account")
    if stat.S_IMODE(status.st_mode) != 0o700:
        os.chmod(root, 0o700)
    return root


class ScratchLease:
    """A run's scratch folder, marked and locked by the flow's process until :meth:`close`.

    The lock is an exclusive ``flock`` on the marker file, held through an open descriptor that no
    child process inherits; it disappears with the process, which is how a later release tells a dead
    run's folder from a live one.
    """

    def __init__(self, root: Path, release_id: str):
        folder = root / f"{release_id}-{uuid.uuid4().hex[:12]}"
        _private_mkdir(folder)
        self._lock: int | None = os.open(folder / MARKER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        os.fchmod(self._lock, 0o600)
        note = {"kepsilon": "scratch", "release_id": release_id, "pid": os.getpid(), "host": socket.gethostname(),
                "started_at": datetime.now(UTC).isoformat(timespec="seconds")}
        os.write(self._lock, json.dumps(note).encode("utf-8"))
        self.scratch = Scratch(folder, ScratchKey.generate())

    def close(self) -> None:
        """Remove the folder, then let go of it."""
        if self._lock is None:
            return
        self.scratch.remove_all()
        os.close(self._lock)
        self._lock = None


# --------------------------------------------------------------------------- the sweep


def sweep_leftover_scratch(spec, logger=None) -> list[Path]:
    """Remove the scratch folders dead runs left (any release id; marker present, lock free) under the
    spec's scratch base and the default one, and the old layout's ``OUTPUT_DIR/.<id>.scratch`` folders;
    log one line naming what was removed (never its contents). Never fails a release: a folder that
    cannot be inspected or removed is left, with a warning."""
    import logging

    logger = logger or _run_logger() or logging.getLogger("kepsilon.scratch")
    bases = {Path(tempfile.gettempdir()).resolve()}
    if spec.execution.scratch:
        bases.add(Path(spec.execution.scratch).resolve())
    removed, failed = [], []
    for base in sorted(bases):
        root = account_root(base)
        try:
            candidates = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()] if _owned_dir(root) else []
        except OSError:
            continue
        for folder in candidates:
            outcome = _remove_if_dead(folder)
            if outcome is True:
                removed.append(folder)
            elif outcome is None:
                failed.append(folder)
    removed += _sweep_old_layout(Path(spec.output_dir))
    if removed:
        logger.info("removed %d scratch folder(s) left by interrupted Dask runs (their contents unread): %s",
                    len(removed), ", ".join(str(p) for p in removed))
    if failed:
        logger.warning("could not remove %d leftover scratch folder(s): %s", len(failed), ", ".join(map(str, failed)))
    return removed


def _run_logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow run: the module's logger
        return None


def _owned_dir(path: Path) -> bool:
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()


def _remove_if_dead(folder: Path) -> bool | None:
    """True: removed (ours, its run dead); False: left (not ours, or its run is alive); None: could not remove."""
    try:
        descriptor = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no marker: not a run folder of ours (or one being created)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live run holds it
        try:
            note = json.loads(os.read(descriptor, 4096) or b"{}")
        except ValueError:
            return False
        if not isinstance(note, dict) or note.get("kepsilon") != "scratch":
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return None if folder.exists() else True
    finally:
        os.close(descriptor)


def _sweep_old_layout(output_dir: Path) -> list[Path]:
    """Remove ``OUTPUT_DIR/.<id>.scratch`` folders of versions that kept the scratch beside the output
    (recognised by their name and their stage sub-folders; they had no lock, and no current run writes there)."""
    removed: list[Path] = []
    try:
        candidates = list(output_dir.glob(".*.scratch"))
    except OSError:
        return removed
    for folder in candidates:
        try:
            if not _owned_dir(folder) or not {p.name for p in folder.iterdir()} <= _LEGACY_PARTS:
                continue
        except OSError:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed
