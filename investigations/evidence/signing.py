"""A package's manifest, hashed and optionally signed in the shape of WACZ signing.

`datapackage-digest.json` sits beside `datapackage.json`, as in a signed WACZ (Webrecorder's "WACZ
Signing and Verification" 0.1.0, its anonymous signature):

    {"path": "datapackage.json", "hash": "sha256:<hex>",
     "signedData": {"hash": "sha256:<hex>", "created": "<ISO 8601>", "software": "...",
                    "version": "...", "signature": "<base64>", "publicKey": "<base64>"}}

- `hash`: the sha256 of `datapackage.json`'s bytes, which hashes every other file of the package;
- `signature`: ECDSA over the UTF-8 bytes of `hash` with SHA-256, on curve P-384, written as the
  raw `r || s` (IEEE P1363, as WebCrypto and ArchiveWeb.page make it), base64;
- `publicKey`: the signing key's public half, DER SubjectPublicKeyInfo, base64.

An unsigned package has the digest without `signedData`. The signature proves the package is the
one the key's holder exported, no more: whose key it is, the operator says out of band, by the
fingerprint `investigations signing-key` printed (sha256 of the public key's DER, shown as hex).

The private key is a PEM file that the `INVESTIGATIONS_SIGNING_KEY` setting names (with its
passphrase, if any, in `INVESTIGATIONS_SIGNING_KEY_PASSPHRASE`); neither is ever printed or written
into the package.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

DIGEST_FILE = "datapackage-digest.json"
KEY_ENV = "INVESTIGATIONS_SIGNING_KEY"
PASSPHRASE_ENV = "INVESTIGATIONS_SIGNING_KEY_PASSPHRASE"
CURVE = ec.SECP384R1()
_COORDINATE_BYTES = 48  # P-384: r and s are 48 bytes each in the raw form


class SigningError(ValueError):
    """A signing key that cannot be used; the message says why, never the key."""


@dataclass(frozen=True)
class DigestCheck:
    """What a package's digest file says of its manifest."""

    problems: list[str]
    signed: bool = False
    fingerprint: str | None = None  # the signing key's, when the signature is valid


def fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """The key's fingerprint: sha256 of its DER SubjectPublicKeyInfo, as `sha256:<hex>`."""
    return f"sha256:{hashlib.sha256(_public_der(public_key)).hexdigest()}"


def new_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """Make a P-384 key and write it to `path` as PEM, readable by its owner only; a file that is
    there already is never overwritten (FileExistsError)."""
    key = ec.generate_private_key(CURVE)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return key


def load_signing_key(env: Mapping[str, str] | None = None) -> ec.EllipticCurvePrivateKey:
    """The operator's key, from the PEM file `INVESTIGATIONS_SIGNING_KEY` names."""
    env = os.environ if env is None else env
    where = env.get(KEY_ENV)
    if not where:
        raise SigningError(f"{KEY_ENV} is not set: point it at the PEM file of your signing key "
                           "(`investigations signing-key PATH` makes one)")
    try:
        pem = Path(where).read_bytes()
    except OSError as exc:
        raise SigningError(f"{KEY_ENV}: cannot read the key file ({exc.strerror})") from None
    passphrase = env.get(PASSPHRASE_ENV)
    try:
        key = serialization.load_pem_private_key(pem, password=passphrase.encode() if passphrase else None)
    except (ValueError, TypeError):
        raise SigningError(f"{KEY_ENV}: not a PEM private key, or its passphrase ({PASSPHRASE_ENV}) is "
                           "missing or wrong") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != CURVE.name:
        raise SigningError(f"{KEY_ENV}: the key must be ECDSA on P-384 (secp384r1), as WACZ signing uses")
    return key


def write_digest(folder: Path, manifest: str, *, software: str, version: str,
                 key: ec.EllipticCurvePrivateKey | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Write `datapackage-digest.json` for the manifest in `folder`, signed with `key` if given."""
    digest = f"sha256:{hashlib.sha256((folder / manifest).read_bytes()).hexdigest()}"
    document: dict[str, Any] = {"path": manifest, "hash": digest}
    if key is not None:
        r, s = decode_dss_signature(key.sign(digest.encode(), ec.ECDSA(hashes.SHA256())))
        raw = r.to_bytes(_COORDINATE_BYTES, "big") + s.to_bytes(_COORDINATE_BYTES, "big")
        document["signedData"] = {
            "hash": digest,
            "created": (now or datetime.now(UTC)).isoformat(timespec="seconds"),
            "software": software,
            "version": version,
            "signature": base64.b64encode(raw).decode(),
            "publicKey": base64.b64encode(_public_der(key.public_key())).decode(),
        }
    (folder / DIGEST_FILE).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document


def check_digest(folder: Path, manifest: str, *, expected_key: ec.EllipticCurvePublicKey | None = None
                 ) -> DigestCheck:
    """Check `datapackage-digest.json` against the manifest: its hash, and its signature when it has
    one. With `expected_key`, the package must be signed by that key."""
    path = folder / DIGEST_FILE
    if not path.is_file():
        return DigestCheck(problems=[f"{DIGEST_FILE}: missing, so the package is not signed"]
                           if expected_key is not None else [])
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        digest, signed = document["hash"], document.get("signedData")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return DigestCheck(problems=[f"{DIGEST_FILE}: unreadable ({type(exc).__name__}: {exc})"])
    problems: list[str] = []
    actual = f"sha256:{hashlib.sha256((folder / manifest).read_bytes()).hexdigest()}"
    if document.get("path") != manifest:
        problems.append(f"{DIGEST_FILE}: it digests {document.get('path')!r}, not {manifest}")
    if digest != actual:
        problems.append(f"{DIGEST_FILE}: {manifest} hashes to {actual}, the digest says {digest}")
    if not signed:
        if expected_key is not None:
            problems.append(f"{DIGEST_FILE}: the package is not signed")
        return DigestCheck(problems=problems)
    try:
        public = serialization.load_der_public_key(base64.b64decode(signed["publicKey"], validate=True))
        raw = base64.b64decode(signed["signature"], validate=True)
        signed_hash = signed["hash"]
    except (ValueError, KeyError, TypeError) as exc:
        return DigestCheck(problems=[*problems, f"{DIGEST_FILE}: unreadable signedData ({type(exc).__name__})"],
                           signed=True)
    if not isinstance(public, ec.EllipticCurvePublicKey) or len(raw) != 2 * _COORDINATE_BYTES:
        return DigestCheck(problems=[*problems, f"{DIGEST_FILE}: the signature is not ECDSA P-384"], signed=True)
    if signed_hash != digest:
        problems.append(f"{DIGEST_FILE}: the signed hash {signed_hash} is not the digest's {digest}")
    signature = encode_dss_signature(int.from_bytes(raw[:_COORDINATE_BYTES], "big"),
                                     int.from_bytes(raw[_COORDINATE_BYTES:], "big"))
    try:
        public.verify(signature, str(signed_hash).encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return DigestCheck(problems=[*problems, f"{DIGEST_FILE}: the signature does not match its public key"],
                           signed=True)
    if expected_key is not None and _public_der(public) != _public_der(expected_key):
        problems.append(f"{DIGEST_FILE}: signed by key {fingerprint(public)}, not by {fingerprint(expected_key)}")
    return DigestCheck(problems=problems, signed=True, fingerprint=fingerprint(public))


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """A public key from a PEM file (its public half, or the private key it belongs to)."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise SigningError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        if b"PRIVATE KEY" in pem:
            private = serialization.load_pem_private_key(pem, password=None)
            key: object = private.public_key()
        else:
            key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        raise SigningError(f"{path}: not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SigningError(f"{path}: not an ECDSA key")
    return key


def public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    """The key's public half as PEM, to hand to whoever checks the packages."""
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _public_der(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
