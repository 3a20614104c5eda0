"""Whether a control-plane component serves: etcd's /health, kube-apiserver's /readyz, the others' /healthz.

:func:`check` reads where to ask from the component's own command line (its pidfile's argv), so the
same probe serves a fresh start and an in-place upgrade (``ControlPlane.upgrade``).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

Check = Callable[[], tuple[bool, str]]
"""Returns (ready, what was seen)."""


def https_get(url: str, context: ssl.SSLContext, timeout: float = 3.0) -> tuple[int, str]:
    """GET ``url``: (HTTP status, body), also for error statuses."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")


def _etcd(url: str) -> Check:
    def ready() -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read().decode(errors="replace")
        except (OSError, urllib.error.URLError) as err:
            return False, str(err)
        try:
            return json.loads(body).get("health") == "true", body
        except ValueError:
            return False, body

    return ready


def _https(url: str, context: ssl.SSLContext, failing_lines: bool) -> Check:
    def ready() -> tuple[bool, str]:
        try:
            status, body = https_get(url, context)
        except OSError as err:
            return False, str(err)
        failing = [line for line in body.splitlines() if "failed" in line] if failing_lines else []
        return status == 200, f"HTTP {status}: " + ("; ".join(failing) or body[-300:])

    return ready


def check(name: str, argv: Sequence[str], admin: ssl.SSLContext) -> Check:
    """The readiness probe of component ``name`` started with ``argv`` (``admin``: the admin's TLS context)."""
    value = {a.split("=", 1)[0]: a.split("=", 1)[-1] for a in argv[1:]}
    if name == "etcd":
        return _etcd(value["--listen-client-urls"] + "/health")
    if name == "kube-apiserver":
        return _https(f"https://127.0.0.1:{value['--secure-port']}/readyz?verbose", admin, failing_lines=True)
    insecure = ssl.create_default_context()  # kube-controller-manager and kube-scheduler serve self-signed
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    return _https(f"https://127.0.0.1:{value['--secure-port']}/healthz", insecure, failing_lines=False)
