"""Fixtures of the least-privilege e2e tests: the installed manifests, two heartbeating nodes, the identities.

``installed`` applies the manifests (CRDs established); ``two_nodes`` keeps two Node objects alive;
``driver_a`` is the driver's identity bound to the first node, ``controller`` the controller's.
Module-scoped: each test module that imports them gets its own nodes and tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from e2e.cluster import handle as cluster
from e2e.plane import identity, install, nodes


@pytest.fixture(scope="module", name="installed")
def installed_fixture(control_plane: cluster.Cluster) -> cluster.Cluster:
    install.apply(control_plane)
    install.wait_established(control_plane, install.crd_names(install.render(control_plane)))
    return control_plane


@pytest.fixture(scope="module", name="two_nodes")
def two_nodes_fixture(installed: cluster.Cluster) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:5]
    names = (f"rbac-a-{suffix}", f"rbac-b-{suffix}")
    beats = [nodes.NodeHeartbeat(n, installed.api, delete_on_stop=True) for n in names]
    for beat in beats:
        beat.start()
    try:
        yield names
    finally:
        for beat in beats:
            beat.stop()


@pytest.fixture(scope="module", name="driver_a")
def driver_a_fixture(
    installed: cluster.Cluster, two_nodes: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> identity.Identity:
    return identity.driver_identity(installed, two_nodes[0], tmp_path_factory.mktemp("identities"))


@pytest.fixture(scope="module", name="controller")
def controller_fixture(installed: cluster.Cluster, tmp_path_factory: pytest.TempPathFactory) -> identity.Identity:
    return identity.controller_identity(installed, tmp_path_factory.mktemp("identities"))
