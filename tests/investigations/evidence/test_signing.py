"""A package's manifest digest, signed in the shape of WACZ signing's anonymous signature: made with
the operator's key, checked against the key it names and, when asked, against the key they hold."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from investigations.evidence.signing import (
    DIGEST_FILE,
    KEY_ENV,
    PASSPHRASE_ENV,
    DigestCheck,
    SigningError,
    check_digest,
    fingerprint,
    load_public_key,
    load_signing_key,
    new_signing_key,
    write_digest,
)

MANIFEST = "datapackage.json"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    out = tmp_path / "package"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"resources": [{"path": "a.txt", "hash": "sha256:00"}]}))
    return out


@pytest.fixture
def key(tmp_path: Path) -> ec.EllipticCurvePrivateKey:
    return new_signing_key(tmp_path / "key.pem")


def test_the_signed_digest_has_wacz_signings_shape_and_a_signature_any_ecdsa_verifier_accepts(
        package: Path, key: ec.EllipticCurvePrivateKey) -> None:
    written = write_digest(package, MANIFEST, software="investigations-fleet", version="1.0", key=key)
    document = json.loads((package / DIGEST_FILE).read_text())
    assert document == written
    digest = f"sha256:{hashlib.sha256((package / MANIFEST).read_bytes()).hexdigest()}"
    assert document["path"] == MANIFEST and document["hash"] == digest
    signed = document["signedData"]
    assert set(signed) == {"hash", "created", "software", "version", "signature", "publicKey"}
    assert signed["hash"] == digest
    # Read back as a WACZ verifier does: the public key from DER SPKI, the signature as raw r || s
    # over the hash string with SHA-256 on P-384.
    public = serialization.load_der_public_key(base64.b64decode(signed["publicKey"]))
    raw = base64.b64decode(signed["signature"])
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1" and len(raw) == 96
    public.verify(encode_dss_signature(int.from_bytes(raw[:48], "big"), int.from_bytes(raw[48:], "big")),
                  digest.encode(), ec.ECDSA(hashes.SHA256()))
    check = check_digest(package, MANIFEST, expected_key=key.public_key())
    assert check.problems == [] and check.signed and check.fingerprint == fingerprint(key.public_key())


def test_an_unsigned_digest_checks_the_manifest_and_names_no_key(package: Path) -> None:
    write_digest(package, MANIFEST, software="s", version="1")
    assert "signedData" not in json.loads((package / DIGEST_FILE).read_text())
    assert check_digest(package, MANIFEST) == DigestCheck(problems=[])
    (package / MANIFEST).write_text("{}")
    (problem,) = check_digest(package, MANIFEST).problems
    assert problem.startswith(f"{DIGEST_FILE}: {MANIFEST} hashes to sha256:")


def test_a_manifest_changed_after_signing_fails_even_with_its_digest_made_again(
        package: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_digest(package, MANIFEST, software="s", version="1", key=key)
    (package / MANIFEST).write_text(json.dumps({"resources": []}))
    document = json.loads((package / DIGEST_FILE).read_text())
    document["hash"] = f"sha256:{hashlib.sha256((package / MANIFEST).read_bytes()).hexdigest()}"
    (package / DIGEST_FILE).write_text(json.dumps(document))
    check = check_digest(package, MANIFEST)
    assert check.problems == [f"{DIGEST_FILE}: the signed hash {document['signedData']['hash']} is not the "
                              f"digest's {document['hash']}"]


def test_a_signed_hash_changed_with_the_manifest_fails_its_signature(package: Path, key: ec.EllipticCurvePrivateKey
                                                                     ) -> None:
    write_digest(package, MANIFEST, software="s", version="1", key=key)
    (package / MANIFEST).write_text(json.dumps({"resources": []}))
    document = json.loads((package / DIGEST_FILE).read_text())
    document["hash"] = document["signedData"]["hash"] = (
        f"sha256:{hashlib.sha256((package / MANIFEST).read_bytes()).hexdigest()}")
    (package / DIGEST_FILE).write_text(json.dumps(document))
    assert check_digest(package, MANIFEST).problems == [
        f"{DIGEST_FILE}: the signature does not match its public key"]


def test_a_package_re_signed_with_another_key_fails_against_the_key_the_operator_holds(
        package: Path, key: ec.EllipticCurvePrivateKey, tmp_path: Path) -> None:
    other = new_signing_key(tmp_path / "other.pem")
    write_digest(package, MANIFEST, software="s", version="1", key=other)
    assert check_digest(package, MANIFEST).problems == []  # valid, but by whom: the fingerprint says
    (problem,) = check_digest(package, MANIFEST, expected_key=key.public_key()).problems
    assert problem == (f"{DIGEST_FILE}: signed by key {fingerprint(other.public_key())}, not by "
                       f"{fingerprint(key.public_key())}")


def test_an_unsigned_or_undigested_package_fails_when_a_key_is_expected(
        package: Path, key: ec.EllipticCurvePrivateKey) -> None:
    assert check_digest(package, MANIFEST, expected_key=key.public_key()).problems == [
        f"{DIGEST_FILE}: missing, so the package is not signed"]
    write_digest(package, MANIFEST, software="s", version="1")
    assert check_digest(package, MANIFEST, expected_key=key.public_key()).problems == [
        f"{DIGEST_FILE}: the package is not signed"]


def test_a_new_key_is_readable_by_its_owner_only_and_never_overwrites_one(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    new_signing_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        new_signing_key(path)
    assert path.read_bytes() == before


def test_the_key_comes_from_the_file_the_setting_names_with_its_passphrase(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "locked.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"open sesame")))
    loaded = load_signing_key({KEY_ENV: str(path), PASSPHRASE_ENV: "open sesame"})
    assert fingerprint(loaded.public_key()) == fingerprint(key.public_key())


def test_the_key_a_verifier_holds_is_read_from_its_public_half_or_the_private_key_file(
        key: ec.EllipticCurvePrivateKey, tmp_path: Path) -> None:
    public = tmp_path / "key.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    assert fingerprint(load_public_key(public)) == fingerprint(load_public_key(tmp_path / "key.pem")) == fingerprint(
        key.public_key())


@pytest.mark.parametrize(("env", "says"), [
    ({}, f"{KEY_ENV} is not set"),
    ({KEY_ENV: "/nonexistent/key.pem"}, "cannot read the key file"),
    ({KEY_ENV: "{garbage}"}, "not a PEM private key"),
    ({KEY_ENV: "{locked}"}, "passphrase"),
    ({KEY_ENV: "{p256}"}, "must be ECDSA on P-384"),
])
def test_a_key_that_cannot_sign_is_a_clear_error_that_never_shows_the_key(tmp_path: Path, env: dict[str, str],
                                                                           says: str) -> None:
    files = {"garbage": b"not a key", "p256": ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        "locked": ec.generate_private_key(ec.SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"))}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    env = {k: v.format(**{name: str(tmp_path / name) for name in files}) for k, v in env.items()}
    with pytest.raises(SigningError, match=says) as raised:
        load_signing_key(env)
    assert "BEGIN" not in str(raised.value) and "secret" not in str(raised.value)
