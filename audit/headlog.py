"""The chain-head log: an append-only file, outside the database, of every chain head the store committed.

Why: a store rolled back as a whole — its -wal file deleted after a crash, or an older copy put back —
is internally consistent, so the chain alone cannot tell. Each commit that extends the chain appends one
line (chain length, head hash, time); the integrity check then requires the chain to contain every
logged head. A chain *longer* than the log is fine (a crash between the commit and the log write); a
chain shorter than a logged length, or with another hash at that length, is a rollback.

The path is env ``KEPSILON_AUDIT_HEAD_LOG`` (set it in the deployment to a place the store's writers
cannot rewrite: another disk, an append-only mount), else a file *outside the store's folder*, in the
account's state folder: ``$XDG_STATE_HOME/kepsilon/heads/<store>-<hash of the store's path>.heads``
(``~/.local/state/...`` without XDG_STATE_HOME). A backup of the store's folder does not hold it, so
putting an old store back does not put back its old log. Earlier versions kept it beside the store
(``<store>.heads``); such a log is moved to the new place the first time the store is checked.
The log is created 0600 (its folder 0700 when this creates it), like the store. Once the store has
chain entries, a missing log is an error (``integrity.py``), never silence.
Each line is one JSON object written with a single ``write`` on an ``O_APPEND`` descriptor and fsynced,
so concurrent writers never interleave and a torn last line (a crash mid-write) is simply skipped.

A store removed on purpose (a checkout deleted and cloned again) leaves its log behind, and the log then
refuses the empty store as rolled back — rightly: a deleted store looks exactly like one wiped to reset spent ε.
``retire_head_log`` (``kepsilon audit retire-head-log --by NAME --reason TEXT``, allowed only while the store
has no chain) is the recorded way to start from nothing: the log is kept, renamed ``<log>.retired-<UTC time>``,
with a last line saying who retired it, why, when and the most advanced head it held.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kepsilon import settings

from .private import FILE_MODE, check_not_shared, make_private_folder, owner_only

ENV_HEAD_LOG = "KEPSILON_AUDIT_HEAD_LOG"
SUFFIX = ".heads"
# The tail read to find the latest heads: thousands of lines, far more than commits can race.
_TAIL_BYTES = 256 * 1024
_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class LoggedHead:
    """One line of the head log: the chain had ``entries`` entries, the last one hashing to ``head_hash``."""

    entries: int
    head_hash: str
    at: str


def head_log_path(store: str | Path, head_log: str | Path | None = None) -> Path:
    """``head_log`` if given, else env KEPSILON_AUDIT_HEAD_LOG, else ``default_head_log(store)``."""
    if head_log is not None:
        return Path(head_log)
    configured = settings.current().audit_head_log
    if configured is not None:
        return configured
    return default_head_log(store)


def head_log_place(path: str | Path) -> str:
    """Where the head log at ``path`` is, as a message says it: the setting's name when KEPSILON_AUDIT_HEAD_LOG
    chose it, else the path.

    A setting's value is never repeated in a message (the rule for bad settings: name the setting, not what
    was typed, which may be absurd or private); the default place in the state folder was not typed by
    anyone, and its path is what an operator needs to find it.
    """
    configured = settings.current().audit_head_log
    if configured is not None and Path(configured) == Path(path):
        return ENV_HEAD_LOG
    return str(path)


def head_log_named(path: str | Path) -> str:
    """``its head log '<path>'``, or ``its head log (KEPSILON_AUDIT_HEAD_LOG)`` when the setting chose it."""
    place = head_log_place(path)
    return f"its head log ({place})" if place == ENV_HEAD_LOG else f"its head log {place!r}"


def state_folder() -> Path:
    """Where the default head logs live: ``$XDG_STATE_HOME/kepsilon/heads`` or ``~/.local/state/kepsilon/heads``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kepsilon" / "heads"


def default_head_log(store: str | Path) -> Path:
    """The store's own log in the state folder, named after the store's absolute path (one log per store)."""
    absolute = Path(os.path.abspath(store))
    digest = hashlib.sha256(str(absolute).encode("utf-8")).hexdigest()[:24]
    return state_folder() / f"{absolute.name}-{digest}{SUFFIX}"


def legacy_head_log(store: str | Path) -> Path:
    """Where earlier versions kept the log: beside the store, sharing its fate."""
    return Path(str(store) + SUFFIX)


def adopt_legacy_head_log(store: str | Path) -> None:
    """Move an earlier version's log from beside the store to the default place (once; only when the
    default is in use, absent there, and an old log exists). Copied and synced before the old one goes."""
    if settings.current().audit_head_log is not None:
        return
    target, legacy = default_head_log(store), legacy_head_log(store)
    if target.exists() or not legacy.is_file():
        return
    if not target.parent.exists():
        make_private_folder(target.parent)
    temporary = target.with_name(f".{target.name}.moving")
    shutil.copyfile(legacy, temporary)
    os.chmod(temporary, FILE_MODE)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    _fsync_directory(target.parent)
    legacy.unlink()


def check_head_log_place(path: Path) -> None:
    """Refuse a head log whose folder others can write to, and narrow an older, wider log to its owner.

    Run when the store is opened, before anything is written: after a commit it would be too late to refuse.
    """
    if path.parent.exists():
        check_not_shared(path.parent, ENV_HEAD_LOG)
    owner_only(path, ENV_HEAD_LOG)


def append_head(path: Path, entries: int, head_hash: str, store: str) -> None:
    """Append one head line and fsync it (and, for a new file, its directory entry).

    A previous writer's torn last line (no trailing newline) gets a newline first, so the new line
    stays parseable on its own.
    """
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    line = json.dumps({"entries": entries, "head_hash": head_hash, "at": at, "store": store}, ensure_ascii=False)
    if not path.parent.exists():
        make_private_folder(path.parent)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        if created:
            os.fchmod(fd, FILE_MODE)  # whatever the umask: the log is as private as the store
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if torn else "") + line + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_directory(path.parent)


RETIRED = ".retired-"
RETIRE_COMMAND = "kepsilon audit retire-head-log --by NAME --reason TEXT"


@dataclass(frozen=True)
class RetiredLog:
    """A retired head log: where its copy now is, and the most advanced head it held (None: no readable line)."""

    path: Path
    latest: LoggedHead | None


def most_advanced(heads: list[LoggedHead]) -> LoggedHead | None:
    """The head with the longest chain among ``heads`` (None when there is none)."""
    return max(heads, key=lambda head: head.entries) if heads else None


def latest_head(path: Path) -> LoggedHead | None:
    """The most advanced readable head of the log at ``path`` (None when it has none or does not exist);
    raises ``OSError`` when it exists but cannot be read."""
    return most_advanced(read_heads(path)[0])


def retire_head_log(path: Path, by: str, reason: str, store: str) -> RetiredLog:
    """Move the head log at ``path`` aside, beside itself, as ``<name>.retired-<UTC time>``, its last line
    recording the retirement (who, why, when, the store, the most advanced head it held).

    The caller has made sure the store has no chain (a log is never retired under a store it witnesses).
    The retired copy is written under a temporary name (0600, fsynced), linked into place — ``link`` never
    replaces a file, so a retired copy of the same second keeps its name and this one gets ``.1``, ``.2`` —
    and the folder synced before the log itself is removed: a crash in between leaves both, never neither.
    The retirement line has no top-level ``entries``, so a reader of heads skips it.
    Raises ``FileNotFoundError`` when there is no log, ``OSError`` when it cannot be read or moved.
    """
    import tempfile

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # a link planted at the log's name is not followed
    with os.fdopen(fd, "rb") as handle:
        content = handle.read()
    latest = most_advanced(_heads_in(content[-_TAIL_BYTES:], len(content) > _TAIL_BYTES)[0])
    now = datetime.now(UTC)
    line = json.dumps({
        "retired_at": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "by": by, "reason": reason, "store": store,
        "retired_head": None if latest is None else {"entries": latest.entries, "head_hash": latest.head_hash,
                                                     "at": latest.at},
    }, ensure_ascii=False)
    if content and not content.endswith(b"\n"):
        content += b"\n"  # a torn last line stays apart from the retirement's
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.retiring-")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(content + (line + "\n").encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        for attempt in range(100):
            retired = path.with_name(f"{path.name}{RETIRED}{stamp}" + (f".{attempt}" if attempt else ""))
            try:
                os.link(temporary, retired)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{path.name}{RETIRED}{stamp}")
    finally:
        os.unlink(temporary)
    _fsync_directory(path.parent)
    path.unlink()
    _fsync_directory(path.parent)
    return RetiredLog(retired, latest)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform/file system; the file itself is synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_heads(path: Path) -> tuple[list[LoggedHead], int]:
    """The readable heads in the log's tail, oldest first, and how many non-empty lines were unreadable.

    A torn last line and the partial first line of the tail window are not counted as unreadable.
    Raises ``OSError`` if the file exists but cannot be read; returns ``([], 0)`` if it does not exist.
    """
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - _TAIL_BYTES)
            handle.seek(start)
            data = handle.read()
    except FileNotFoundError:
        return [], 0
    return _heads_in(data, start > 0)


def _heads_in(data: bytes, mid_line: bool) -> tuple[list[LoggedHead], int]:
    """``read_heads`` of the bytes read; ``mid_line``: they begin inside a line (a tail window)."""
    lines = data.split(b"\n")
    if mid_line:
        lines = lines[1:]  # begins mid-line
    if not data.endswith(b"\n"):
        lines = lines[:-1]  # torn by a crash mid-write
    heads, unreadable = [], 0
    for raw in lines:
        if not raw.strip():
            continue
        head = _parse(raw)
        if head is None:
            unreadable += 1
        else:
            heads.append(head)
    return heads, unreadable


def _parse(raw: bytes) -> LoggedHead | None:
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(item, dict):
        return None
    entries, head_hash = item.get("entries"), item.get("head_hash")
    if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
        return None
    if not isinstance(head_hash, str) or not _HASH.match(head_hash):
        return None
    return LoggedHead(entries, head_hash, str(item.get("at", "")))
