"""Fixtures for end-to-end tests: one real control plane per test session.

``control_plane`` builds the binaries if they are not cached (run
``python -m e2e build`` beforehand: a cold build takes far longer than a test
timeout), starts etcd, kube-apiserver, kube-controller-manager and
kube-scheduler in a temporary state directory, yields an ``e2e.cluster.Cluster``
(``kubeconfig``, ``kubectl(*args)``, ``api``), and stops every process at the end.
SIGTERM to pytest becomes KeyboardInterrupt so teardown still runs, and the
components die with the pytest process if it is killed outright.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from e2e import build, cluster, controlplane


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.Cluster]:
    previous = signal.signal(signal.SIGTERM, _interrupt)
    bins = build.ensure_binaries()
    state_dir = tmp_path_factory.mktemp("control-plane")
    plane = controlplane.ControlPlane(state_dir, bins, die_with_parent=True)
    try:
        kubeconfig = plane.start()
        handle = cluster.Cluster.connect(kubeconfig, bins, state_dir=state_dir)
        try:
            yield handle
        finally:
            handle.close()
    finally:
        plane.stop()
        signal.signal(signal.SIGTERM, previous)
