"""Mutual TLS for a cluster's routes: a private CA and one node certificate that every node of
the cluster presents and accepts.

A route password alone does not keep a stranger out: while a node is down, a local user who
listens on its route port receives the other nodes' route CONNECT, password and all, and can
then join with it. With ``cluster { tls { verify: true } }`` a node completes a route's TLS
handshake, both ways, only with a peer presenting a certificate of the cluster's CA, before it
sends anything of its own: a squatter without one never sees a CONNECT.

The CA signs the node certificate once and its private key is then thrown away: nothing can
sign another certificate the cluster would accept. The three nodes share the node certificate
(SAN IP 127.0.0.1 and DNS localhost; every node listens on 127.0.0.1), so nothing else needs
signing.

Rotation (``rotate``, `hoist certs rotate`) therefore makes a new CA and a new node certificate
it signed (and throws that CA's key away too), and moves the running nodes over in three
reloads, each step's files trusted by the nodes still on the step before: trust the old and
the new CA; present the new certificate; trust the new CA only. nats-server re-reads the
``cluster { tls {} }`` files on a reload (SIGHUP) and uses them for every route handshake from
then on, while the routes already up keep their TLS connections: none is dropped.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CA_FILE = "route-ca.pem"
CERT_FILE = "route-cert.pem"
KEY_FILE = "route-key.pem"
VALID_DAYS = 3650  # a local stack's data dir outlives a year; `hoist certs rotate` makes new ones
HANDSHAKE_TIMEOUT_S = 2


@dataclass(frozen=True)
class RouteTLS:
    """The paths of a cluster's route CA certificate, node certificate and node key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_dir(cls, directory: Path) -> RouteTLS:
        d = Path(directory).resolve()
        return cls(d / CA_FILE, d / CERT_FILE, d / KEY_FILE)

    def files(self) -> tuple[Path, Path, Path]:
        return self.ca_file, self.cert_file, self.key_file

    def settings(self) -> str:
        """The ``tls`` block of a ``cluster {}``: this certificate, peers verified by the CA."""
        return (
            "  tls {\n"
            f"    cert_file: {json.dumps(str(self.cert_file))}\n"
            f"    key_file: {json.dumps(str(self.key_file))}\n"
            f"    ca_file: {json.dumps(str(self.ca_file))}\n"
            "    verify: true\n"
            f"    timeout: {HANDSHAKE_TIMEOUT_S}\n"
            "  }\n"
        )


def route_tls(directory: Path) -> RouteTLS:
    """The route CA and node certificate in ``directory``, generated there (each file 0600)
    when any of them is missing: a restarted cluster keeps its certificates, as every node
    must trust the same CA."""
    tls = RouteTLS.in_dir(directory)
    if all(f.exists() for f in tls.files()):
        for f in tls.files():
            f.chmod(0o600)  # tighten a file someone loosened
        return tls
    ca, cert, key = generate()
    Path(directory).mkdir(parents=True, exist_ok=True)
    # The key and certificate first, the CA last: a half-written set is regenerated whole.
    _write_private(tls.key_file, key)
    _write_private(tls.cert_file, cert)
    _write_private(tls.ca_file, ca)
    return tls


def generate() -> tuple[bytes, bytes, bytes]:
    """A new CA certificate, and a node certificate and key it signed (PEM each); the CA's
    own key is not kept."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = (
        now - datetime.timedelta(minutes=5),
        now + datetime.timedelta(days=VALID_DAYS),
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Hoist cluster route CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    node = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hoist-route")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        # A node is a TLS server to the routes it accepts and a client of those it solicits.
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (
        ca.public_bytes(pem),
        node.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


@dataclass(frozen=True)
class Rotated:
    """What a rotation replaced: the serial numbers of the node certificate before and after,
    and when the new one starts being valid."""

    old_serial: int
    new_serial: int
    not_before: datetime.datetime


ROTATION_STEPS = (
    "trust the old and the new CA",
    "present the new certificate",
    "trust the new CA only",
)


def rotate(directory: Path, reload: Callable[[int, str], None]) -> Rotated:
    """Replace the route CA and node certificate in ``directory`` with new ones without
    dropping a route: write each of ROTATION_STEPS' files, then ``reload(step, what)`` (step
    1..3), which must return only once every running node re-read them. A step's files are
    trusted by nodes still on the previous step, so the nodes may reload in any order within
    a step; a node that is down reads whatever is there when it starts. Should a reload fail,
    the files stay in a state every node accepts, and rotating again finishes the move (the
    CAs trusted then, all of them, stay trusted until its last step)."""
    from cryptography import x509

    tls = RouteTLS.in_dir(directory)
    missing = [str(f) for f in tls.files() if not f.exists()]
    if missing:
        raise FileNotFoundError(f"no route certificates to rotate: {', '.join(missing)} missing")
    old = x509.load_pem_x509_certificate(tls.cert_file.read_bytes())
    trusted = tls.ca_file.read_bytes()
    ca, cert, key = generate()
    _write_private(tls.ca_file, trusted.rstrip(b"\n") + b"\n" + ca)
    reload(1, ROTATION_STEPS[0])
    _write_private(tls.key_file, key)  # no node reloads between these two writes
    _write_private(tls.cert_file, cert)
    reload(2, ROTATION_STEPS[1])
    _write_private(tls.ca_file, ca)
    reload(3, ROTATION_STEPS[2])
    new = x509.load_pem_x509_certificate(cert)
    return Rotated(old.serial_number, new.serial_number, new.not_valid_before_utc)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600), replacing it atomically: a node that reloads or
    starts meanwhile reads the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.chmod(0o600)  # O_CREAT's mode does not apply to a tmp file left by a crash
    os.replace(tmp, path)
