"""Private files: the audit store, its head log, keys and reports — readable by their owner alone.

Every file that holds or unlocks private data is created 0600 inside a folder created 0700, whatever the
process's umask (modes are set explicitly after creation, since a umask can only take bits away at creation
and an older file may predate this rule). A folder someone else can write to is refused: whoever can write
the folder can replace or pre-create the store, its ``-wal`` or the head log (a symlink to their own file)
without touching the files' modes. Sticky world-writable folders (``/tmp``) are refused for the same reason.

Refusals are ``PrivateFolderError`` (a ``SpecError``): one line naming the setting that chose the place,
raised before anything is read or spent.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kepsilon.tasks.errors import SpecError

FOLDER_MODE = 0o700
FILE_MODE = 0o600
# The project's private folder: the default home of the store, its head log, the keys.
DEFAULT_FOLDER = Path(".kepsilon")


class PrivateFolderError(SpecError):
    """A private file's folder is writable by others, or a private file cannot be made owner-only."""


def private_folder(folder: str | Path, setting: str) -> Path:
    """``folder``, created 0700 (with its missing parents) if absent; refused if others can write to it.

    ``setting`` names what chose the folder (e.g. ``KEPSILON_AUDIT_DB``) for the one-line refusal. A folder
    this call created is made 0700 explicitly; an existing one is left as it is when only group or others
    can read it (the files inside are 0600), and refused when they can write to it.
    """
    path = Path(folder)
    if path.exists():
        check_not_shared(path, setting)
        return path
    try:
        make_private_folder(path)
    except OSError as error:
        raise PrivateFolderError(setting, f"its folder {str(path)!r} cannot be created ({error.strerror})") from None
    return path


def make_private_folder(path: Path) -> None:
    """Create ``path`` (and missing parents) and make it 0700 whatever the umask; raises ``OSError``."""
    path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    os.chmod(path, FOLDER_MODE)


def check_not_shared(folder: str | Path, setting: str) -> None:
    """Refuse a folder that group or others can write to (one line naming ``setting`` and the mode)."""
    try:
        mode = os.stat(folder).st_mode
    except OSError as error:
        raise PrivateFolderError(setting, f"its folder {str(folder)!r} cannot be read ({error.strerror})") from None
    if not stat.S_ISDIR(mode):
        raise PrivateFolderError(setting, f"{str(folder)!r} is not a folder")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PrivateFolderError(
            setting,
            f"its folder {str(folder)!r} is writable by group or others (mode {stat.S_IMODE(mode):04o}): "
            "choose a folder only its owner can write to, or `chmod go-w` it",
        )


def owner_only(path: str | Path, setting: str) -> None:
    """Take group's and others' bits off an existing private file (an older one may be 0644).

    The owner's own bits are kept: a store made read-only on purpose stays read-only. Refused when the
    bits cannot be taken off (another account owns the file).
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            os.chmod(path, mode & 0o700)
    except FileNotFoundError:
        return
    except OSError as error:
        raise PrivateFolderError(
            setting, f"{str(path)!r} cannot be made readable by its owner alone ({error.strerror})"
        ) from None


def create_private_file(path: str | Path, setting: str) -> bool:
    """Create ``path`` empty and 0600 if it does not exist; its folder must already be private.

    Returns True when this call created it. An existing file is narrowed to its owner (``owner_only``).
    ``O_NOFOLLOW`` refuses a symlink planted at the name. A file that cannot be created raises ``OSError``.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        owner_only(path, setting)
        return False
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True


def write_private_file(path: str | Path, content: bytes, setting: str) -> bool:
    """Write ``content`` to ``path`` as a new 0600 file (in a 0700 folder); False if it already existed.

    Written under a temporary name, synced, then linked into place (``link`` fails if the name exists),
    so a reader never sees a half-written key, and a process losing the race keeps the winner's content.
    """
    import tempfile

    path = Path(path)
    folder = private_folder(path.parent, setting)
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    except OSError as error:
        raise PrivateFolderError(setting, f"{str(path)!r} cannot be created ({error.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), FILE_MODE)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as error:
            raise PrivateFolderError(setting, f"{str(path)!r} cannot be created ({error.strerror})") from None
    finally:
        os.unlink(temporary)
    return True
