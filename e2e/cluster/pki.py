"""Certificates, keys and kubeconfigs for a loopback control plane.

One CA signs everything: the apiserver's serving certificate, client
certificates for the admin (group ``system:masters``), kube-scheduler,
kube-controller-manager and kube-apiserver's client to kubelets, and node client certificates minted on demand for
kubelet stand-ins (``system:node:<name>`` in ``system:nodes``, which the Node
authorizer and NodeRestriction treat as that node). A separate key pair signs
service-account tokens. Keys are ECDSA P-256: fast to generate, accepted by
every component.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# 10.0.0.1 is the first address of the service range the apiserver is given.
APISERVER_IPS = ("127.0.0.1", "10.0.0.1")


@dataclasses.dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class ClusterPKI:
    """Every file the control plane components are started with."""

    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    scheduler: CertPair
    controller_manager: CertPair
    service_account_key: Path
    service_account_pub: Path
    kubelet_client: CertPair
    """What kube-apiserver presents to kubelets (logs, exec): group system:masters."""


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A CA key and certificate that issues leaf certificates into files."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, files: CertPair) -> None:
        self._key = key
        self._cert = cert
        self.files = files

    @classmethod
    def create(cls, directory: Path, common_name: str = "gpuplane-e2e-ca") -> CertificateAuthority:
        """Create a new self-signed CA as ``ca.crt`` / ``ca.key`` in ``directory``."""
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        files = CertPair(cert=directory / "ca.crt", key=directory / "ca.key")
        directory.mkdir(parents=True, exist_ok=True)
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(files.key, _key_pem(key))
        return cls(key, cert, files)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        """Load the CA that ``create`` wrote into ``directory``."""
        files = CertPair(cert=directory / "ca.crt", key=directory / "ca.key")
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{files.key} is not an EC private key")
        return cls(key, cert, files)

    def issue(
        self,
        directory: Path,
        file_stem: str,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
        server: bool = False,
        client: bool = True,
    ) -> CertPair:
        """Issue a leaf certificate, written as ``<file_stem>.crt`` / ``.key``."""
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_encipherment=True,
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(cert=directory / f"{file_stem}.crt", key=directory / f"{file_stem}.key")
        directory.mkdir(parents=True, exist_ok=True)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(pair.key, _key_pem(key))
        return pair


def write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """Write the service-account token signing key pair; return (private, public)."""
    key = _new_key()
    private = directory / "sa.key"
    public = directory / "sa.pub"
    _write_private(private, _key_pem(key))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def generate_cluster_pki(directory: Path) -> ClusterPKI:
    """Create the CA and every certificate and key the control plane needs."""
    ca = CertificateAuthority.create(directory)
    sa_key, sa_pub = write_service_account_keys(directory)
    return ClusterPKI(
        ca=ca.files,
        apiserver=ca.issue(
            directory,
            "apiserver",
            "kube-apiserver",
            dns_names=APISERVER_DNS,
            ip_addresses=APISERVER_IPS,
            server=True,
            client=False,
        ),
        admin=ca.issue(directory, "admin", "gpuplane-admin", organizations=("system:masters",)),
        scheduler=ca.issue(directory, "kube-scheduler", "system:kube-scheduler"),
        controller_manager=ca.issue(directory, "kube-controller-manager", "system:kube-controller-manager"),
        service_account_key=sa_key,
        service_account_pub=sa_pub,
        kubelet_client=ca.issue(
            directory, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organizations=("system:masters",)
        ),
    )


def mint_node_cert(pki_dir: Path, node_name: str) -> CertPair:
    """Issue a client certificate for kubelet stand-in ``node_name`` from the CA in ``pki_dir``."""
    ca = CertificateAuthority.load(pki_dir)
    return ca.issue(pki_dir / "nodes", node_name, f"system:node:{node_name}", organizations=("system:nodes",))


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: CertPair, user: str) -> Path:
    """Write a self-contained kubeconfig (certificates embedded) for ``user`` at ``server``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuplane-e2e",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": _b64(client.cert), "client-key-data": _b64(client.key)},
            }
        ],
        "contexts": [{"name": "gpuplane-e2e", "context": {"cluster": "gpuplane-e2e", "user": user}}],
        "current-context": "gpuplane-e2e",
        "preferences": {},
    }
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path
