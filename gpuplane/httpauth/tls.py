"""The metrics server's TLS context: a mounted certificate, or a self-signed one made at start.

Self-signed by default, as controller-runtime's secure serving and kube-rbac-proxy
do when no certificate is given: nothing to provision (no cert-manager, no Secret
a tenant could be granted), and the private key never leaves the process's memory
(it reaches OpenSSL through an anonymous memfd, not a file: the controller's root
filesystem is read-only). Authentication rests on the scraper's bearer token, not
on the certificate; Prometheus scrapes with ``insecure_skip_verify`` as it does
kube-rbac-proxy's endpoints. An administrator who wants the scraper to verify the
server mounts a Secret and passes ``--metrics-tls-cert-file``/``--metrics-tls-key-file``.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Iterable, Iterator

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=365)


def self_signed(common_name: str, hosts: Iterable[str]) -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM) for ``hosts`` (addresses or DNS names)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip("[]") for h in hosts if h):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A path OpenSSL can read ``data`` from: a memfd where there is one, else a private temp file."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = memfd("gpuplane-tls", 0)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile() as f:  # pragma: no cover - not Linux
        f.write(data)
        f.flush()
        yield f.name


def server_context(cert_file: str, key_file: str, *, common_name: str, hosts: Iterable[str]) -> ssl.SSLContext:
    """A TLS server context (TLS 1.2 or later) with the given files, or a self-signed pair for ``hosts``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
        return ctx
    cert, key = self_signed(common_name, hosts)
    with _in_memory(cert) as cert_path, _in_memory(key) as key_path:
        ctx.load_cert_chain(cert_path, key_path)
    return ctx
