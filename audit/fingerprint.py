"""The source fingerprint: HMAC-SHA256 of the source's bytes under a secret of the installation.

Why keyed: the private record names the source that produced each release, and reruns find their
reservation through it (``flows/manifest.py``'s idempotency key is built from it). A plain SHA-256 of the
source is a guessing oracle for whoever gets a copy of the store: change one person's value in a copy of
a known table, hash, compare — a height was confirmed after 5,828 hashes. Keyed with a secret that lives
outside the store, the fingerprint still identifies the source (same bytes, same key ⇒ same fingerprint),
but cannot be tested against a guess without the key.

The key: env ``KEPSILON_FINGERPRINT_KEY`` (64 hex digits: for a deployment, or Dask workers on other
machines), else the file named by ``KEPSILON_FINGERPRINT_KEY_FILE``, else ``fingerprint.key`` beside the seed
key file (default ``./.kepsilon/fingerprint.key``), created once, 0600 in a 0700 folder. Back it up with the
store and the seed key: with another key, an interrupted release's rerun no longer finds its reservation,
and officers can no longer match a file with the releases made from it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from kepsilon import settings
from kepsilon.tasks.errors import SpecError

from .private import owner_only, private_folder, write_private_file

ENV_KEY = "KEPSILON_FINGERPRINT_KEY"
ENV_KEY_FILE = "KEPSILON_FINGERPRINT_KEY_FILE"
KEY_FILE_NAME = "fingerprint.key"
KEY_BYTES = 32


def key_file_path() -> Path:
    """The key file: env KEPSILON_FINGERPRINT_KEY_FILE, else ``fingerprint.key`` beside the seed key file."""
    from .seeds import key_file_path as seed_key_file

    return settings.current().fingerprint_key_file or seed_key_file().parent / KEY_FILE_NAME


def fingerprint_key() -> bytes:
    """The installation's fingerprint key: from env, else the key file (created 0600 on first use)."""
    raw = settings.current().fingerprint_key
    if raw:
        return _parse(raw, ENV_KEY)
    path = key_file_path()
    private_folder(path.parent, ENV_KEY_FILE)
    if not path.exists():
        write_private_file(path, secrets.token_hex(KEY_BYTES).encode("ascii") + b"\n", ENV_KEY_FILE)
    owner_only(path, ENV_KEY_FILE)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        raise SpecError(ENV_KEY_FILE, f"{str(path)!r} cannot be read as a fingerprint key") from None
    return _parse(text, ENV_KEY_FILE)


def _parse(text: str, setting: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise SpecError(setting, f"is not a fingerprint key ({2 * KEY_BYTES} hex digits)")
    return key


def source_hasher(key: bytes | None = None) -> hmac.HMAC:
    """A fresh HMAC-SHA256 under the installation's key, fed with ``update`` like ``hashlib.sha256()``."""
    return hmac.new(fingerprint_key() if key is None else key, digestmod=hashlib.sha256)


def source_fingerprint(content: bytes, key: bytes | None = None) -> str:
    """The fingerprint (hex) of one source file's bytes."""
    hasher = source_hasher(key)
    hasher.update(content)
    return hasher.hexdigest()


def file_fingerprint(path: str | Path, key: bytes | None = None) -> str:
    """The fingerprint of a file or a Parquet dataset folder, as a release records it (``tasks/ingest.py``)."""
    from kepsilon.tasks.ingest import dataset_files, dataset_fingerprint

    path = Path(path)
    if path.is_dir():
        files = dataset_files(path)
        return dataset_fingerprint(((f.name, _blocks(f), f.stat().st_size) for f in files), key)
    hasher = source_hasher(key)
    for block in _blocks(path):
        hasher.update(block)
    return hasher.hexdigest()


def _blocks(path: Path, size: int = 8 << 20):
    with open(path, "rb") as handle:
        while block := handle.read(size):
            yield block
