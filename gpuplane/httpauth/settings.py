"""The metrics-serving flags both programs take, validated once at start."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Env = Callable[[str, str], str]

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name, brackets allowed) only ever listens on this machine."""
    bare = host.strip().strip("[]").lower()
    if bare in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


class ServingSettings(BaseModel):
    """How /metrics is served.

    ``auth="kubernetes"`` (the default and the manifests' setting): HTTPS, bearer token
    checked with a TokenReview and a SubjectAccessReview (get /metrics). ``auth="none"``:
    plain HTTP without authentication, for local development; only on a loopback address.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    auth: Literal["kubernetes", "none"] = "kubernetes"
    tls_cert_file: str = ""  # empty (with tls_key_file): a self-signed certificate made at start
    tls_key_file: str = ""
    max_connections: int = Field(default=32, ge=1, le=4096)  # beyond it a connection is closed at once
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)  # a connection's whole life, TLS included
    cache_ttl_s: float = Field(default=10.0, ge=0, le=600)  # how long a token's review is reused
    cache_entries: int = Field(default=256, ge=1, le=65536)

    @model_validator(mode="after")
    def _tls_files_come_in_pairs(self) -> ServingSettings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("--metrics-tls-cert-file and --metrics-tls-key-file must be given together")
        if self.auth == "none" and self.tls_cert_file:
            raise ValueError("--metrics-auth=none serves plain HTTP: TLS files make no sense with it")
        return self

    @property
    def authenticated(self) -> bool:
        return self.auth == "kubernetes"

    def check_bind(self, host: str, what: str = "--metrics-address") -> None:
        """Raise ValueError when unauthenticated metrics would listen beyond this machine."""
        if not self.authenticated and not is_loopback(host or "127.0.0.1"):
            raise ValueError(
                f"--metrics-auth=none serves metrics without authentication and only on a loopback address "
                f"(127.0.0.1, ::1, localhost); {what} binds {host!r}: use --metrics-auth=kubernetes"
            )


def add_arguments(p: argparse.ArgumentParser, env: Env) -> None:
    """Add the ``--metrics-*`` serving flags to ``p`` (``env(NAME, default)`` reads GPUPLANE_NAME)."""
    p.add_argument(
        "--metrics-auth",
        choices=["kubernetes", "none"],
        default=env("METRICS_AUTH", "kubernetes"),
        help="kubernetes: HTTPS, bearer token checked by TokenReview + SubjectAccessReview (get /metrics); "
        "none: plain HTTP without authentication, loopback addresses only (local development)",
    )
    p.add_argument(
        "--metrics-tls-cert-file",
        default=env("METRICS_TLS_CERT_FILE", ""),
        help="PEM certificate of the metrics server (default: a self-signed one made at start)",
    )
    p.add_argument("--metrics-tls-key-file", default=env("METRICS_TLS_KEY_FILE", ""), help="its PEM private key")
    p.add_argument(
        "--metrics-max-connections",
        type=int,
        default=int(env("METRICS_MAX_CONNECTIONS", "32") or 32),
        help="connections served at once; beyond it a new connection is closed at once",
    )
    p.add_argument(
        "--metrics-request-timeout",
        type=float,
        default=float(env("METRICS_REQUEST_TIMEOUT", "10") or 10),
        help="seconds a connection may take (TLS handshake, request, answer) before it is cut off",
    )


def from_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> ServingSettings:
    """The settings of the flags :func:`add_arguments` added (a bad combination: ``p.error``)."""
    try:
        return ServingSettings(
            auth=args.metrics_auth,
            tls_cert_file=args.metrics_tls_cert_file or "",
            tls_key_file=args.metrics_tls_key_file or "",
            max_connections=args.metrics_max_connections,
            request_timeout_s=args.metrics_request_timeout,
        )
    except ValueError as exc:
        p.error(str(exc))
        raise  # p.error exits
