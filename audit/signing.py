"""Ed25519 keys and signed acts: who did something, proven by a key its holder alone keeps.

A signed act is a statement (``payload``: the act's kind, the store's id, the signer's name, the time
and every field of the act, e.g. release id and spec hash) signed with the holder's private key. The
signature covers the canonical JSON of the payload after a fixed prefix, so it cannot be moved to
another act kind, release, spec hash, store or time without failing verification.

Private keys stay with their holders: a file (OpenSSH ``ssh-keygen -t ed25519`` format or PKCS#8 PEM,
unencrypted, mode 0600) named by ``--key`` or env ``KEPSILON_SIGNING_KEY``. Only public keys enter the
store (OpenSSH text, ``ssh-ed25519 AAAA…``); nothing here writes a private key anywhere but ``generate_key``'s
own file.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from kepsilon import settings
from kepsilon.tasks.errors import SpecError

# The environment variable naming the private key file of whoever runs a command or a worker.
ENV_SIGNING_KEY = "KEPSILON_SIGNING_KEY"
# Signed bytes = this prefix + canonical JSON: a kepsilon signature is never valid as anything else.
SIGNATURE_DOMAIN = b"kepsilon-audit-act/1\n"


@dataclass(frozen=True)
class SignedAct:
    """A payload, the public key that signed it (OpenSSH text) and the signature (base64)."""

    payload: dict
    public_key: str
    signature: str

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)


def canonical_payload(payload: dict) -> str:
    """The payload's canonical JSON (sorted keys, no spaces): what is signed and what the store keeps."""
    from .store import canonical_json

    return canonical_json(payload)


def public_key_text(key: Ed25519PublicKey) -> str:
    """``ssh-ed25519 AAAA…`` (no comment): how the store keeps a public key."""
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode("ascii")


def key_id(public_key: str) -> str:
    """``SHA256:…`` as ``ssh-keygen -lf`` prints it: the key's short name in messages and records."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def parse_public_key(text: str, parameter: str) -> str:
    """A public key given as OpenSSH text (``ssh-ed25519 AAAA… comment``) or PEM, as the store keeps it.

    Refuses (``SpecError`` naming ``parameter``) anything that is not an Ed25519 public key.
    """
    raw = text.strip().encode("ascii", errors="replace")
    try:
        if raw.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        else:
            key = serialization.load_ssh_public_key(b" ".join(raw.split()[:2]))
    except (ValueError, UnsupportedAlgorithm, IndexError):
        raise SpecError(parameter, "is not a public key (OpenSSH `ssh-ed25519 …` or PEM)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SpecError(parameter, "is not an Ed25519 key (kepsilon signs with Ed25519 only)")
    return public_key_text(key)


def read_public_key(path: str | Path, parameter: str) -> str:
    """The public key in ``path``: a ``.pub`` file, a PEM public key, or a private key file (its public half)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SpecError(parameter, f"cannot read {str(path)!r} ({error.strerror})") from None
    if b"PRIVATE KEY" in data:
        return public_key_text(load_private_key(path, parameter).public_key())
    return parse_public_key(data.decode("ascii", errors="replace"), parameter)


def key_path(explicit: str | Path | None, parameter: str = "--key") -> tuple[Path | None, str]:
    """The private key file to use and the setting that named it: ``explicit``, else env KEPSILON_SIGNING_KEY."""
    if explicit is not None and str(explicit).strip():
        return Path(explicit), parameter
    configured = settings.current().signing_key
    return (configured, ENV_SIGNING_KEY) if configured is not None and str(configured).strip() else (None, parameter)


def load_private_key(path: str | Path, parameter: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (OpenSSH or PKCS#8 PEM, unencrypted).

    Refused, like ssh refuses it, when group or others can read the file: a key others can read proves
    nothing about who used it. Messages name the setting and the file, never key material.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        data = path.read_bytes()
    except OSError as error:
        raise SpecError(parameter, f"the private key {str(path)!r} cannot be read ({error.strerror})") from None
    if stat.S_IMODE(mode) & 0o077:
        raise SpecError(
            parameter, f"the private key {str(path)!r} can be read by others (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
    key: PrivateKeyTypes  # either loader's: the OpenSSH one reads a subset of the PEM one's types
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY"):
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # encrypted, and no passphrase was given
        raise SpecError(
            parameter, f"the private key {str(path)!r} is protected by a passphrase, which kepsilon does not ask for; "
            "keep an unencrypted copy 0600 in a 0700 folder"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise SpecError(parameter, f"{str(path)!r} is not a private key (OpenSSH or PKCS#8 PEM)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SpecError(parameter, f"the private key {str(path)!r} is not an Ed25519 key (ssh-keygen -t ed25519)")
    return key


def sign(private_key: Ed25519PrivateKey, payload: dict) -> SignedAct:
    """Sign ``payload`` (its canonical JSON after ``SIGNATURE_DOMAIN``)."""
    message = SIGNATURE_DOMAIN + canonical_payload(payload).encode("utf-8")
    signature = base64.b64encode(private_key.sign(message)).decode("ascii")
    return SignedAct(payload=payload, public_key=public_key_text(private_key.public_key()), signature=signature)


def signature_valid(public_key: str, payload_text: str, signature: str) -> bool:
    """Whether ``signature`` is ``public_key``'s signature over the canonical payload text."""
    try:
        key = serialization.load_ssh_public_key(public_key.encode("ascii"))
        raw = base64.b64decode(signature, validate=True)
    except (ValueError, UnsupportedAlgorithm):
        return False
    if not isinstance(key, Ed25519PublicKey):
        return False
    try:
        key.verify(raw, SIGNATURE_DOMAIN + payload_text.encode("utf-8"))
    except InvalidSignature:
        return False
    return True


def generate_key(path: str | Path) -> str:
    """A new Ed25519 key pair: the private key to ``path`` (OpenSSH format, 0600, never overwritten) and the
    public key to ``path.pub``; returns the public key text."""
    from .private import write_private_file

    path = Path(path)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    if not write_private_file(path, private, "FILE"):
        raise SpecError("FILE", f"{str(path)!r} already exists; kepsilon never overwrites a key")
    public = public_key_text(key.public_key())
    temporary = path.with_name(path.name + ".pub.tmp")
    temporary.write_text(public + "\n", encoding="ascii")
    os.replace(temporary, path.with_name(path.name + ".pub"))
    return public
