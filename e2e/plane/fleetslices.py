"""gpuplane's ResourceSlices for a KWOK fleet: the driver's own discovery, slice builder and publisher,
for many nodes in one process, each node's slices written under that node's driver identity.

Per node, exactly the driver's publish path from the hardware boundary up:
the simulator (``gpuplane.driver.hw.sim``, state in ``<sim_root>/<node>``, writes not fsync'd)
-> ``inventory.discover`` -> ``publish.publisher.SlicePublisher`` (which calls
``publish.slices.build_pool``, ``render_slices`` and ``validate_pool``) -> ``driver.kube.KubeApi``.
Health changes go in the way the driver's health watcher hands them over: as device taints per
GPU that the publisher reads on every publish (``set_taints``).

Identity: every node gets the ``gpuplane-driver`` ServiceAccount's token bound to a stand-in
driver pod on that node (``e2e.plane.identity.stand_in_pod`` + ``request_token``), which is the
identity a DaemonSet pod has. KWOK reports those pods Running. The admission policy
``gpuplane-driver-own-node-slices`` (``manifests/policies``) matches that user and reads the
node from the token's ``authentication.kubernetes.io/node-name`` extra, so each node's
publisher may write its own node's slices and no other's: the policy is exercised, not
bypassed, on every create, update and delete.

Each node's API client is opened for a publish pass and closed after it, so a 1,000-node fleet
does not hold 1,000 idle connections to the API server between passes.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.cluster.handle import Cluster
from e2e.plane import fleet, identity
from gpuplane.api import names
from gpuplane.driver import inventory as inventory_mod
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.kube import KubeApi
from gpuplane.driver.publish import slices
from gpuplane.driver.publish.publisher import SlicePublisher
from gpuplane.driver.publish.slices import DeviceTaint

Printer = Callable[[str], None]

TOKEN_SECONDS = 6 * 3600


class CountingSliceApi:
    """``KubeApi``'s slice calls, counted (what a publish pass costs the API server)."""

    def __init__(self, api: KubeApi, counts: dict[str, int], lock: threading.Lock) -> None:
        self._api = api
        self._counts = counts
        self._lock = lock

    def _count(self, verb: str) -> None:
        with self._lock:
            self._counts[verb] = self._counts.get(verb, 0) + 1

    def list_slices(self, node_name: str, driver_name: str) -> list[dict[str, Any]]:
        """LIST this node's slices."""
        self._count("list")
        return self._api.list_slices(node_name, driver_name)

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """CREATE one slice."""
        self._count("create")
        return self._api.create_slice(body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """UPDATE one slice."""
        self._count("update")
        return self._api.replace_slice(name, body)

    def delete_slice(self, name: str) -> None:
        """DELETE one slice."""
        self._count("delete")
        self._api.delete_slice(name)


@dataclasses.dataclass
class NodePool:
    """One node's driver-side state: its inventory, taints, token and publisher."""

    node: fleet.FleetNode
    token: str = ""
    inventory: inventory_mod.Inventory | None = None
    taints: dict[str, tuple[DeviceTaint, ...]] = dataclasses.field(default_factory=dict)
    publisher: SlicePublisher | None = None


@dataclasses.dataclass(frozen=True)
class PublishPass:
    """What one publish pass over the fleet did."""

    nodes: int
    written: int  # nodes whose slices changed
    seconds: float
    calls: Mapping[str, int]  # verb -> API calls
    devices: int
    slices: int


class FleetSlices:
    """The fleet's driver-side publishers, run in this process on a thread pool."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: Sequence[fleet.FleetNode],
        sim_root: Path,
        *,
        workers: int = 8,
        token_seconds: int = TOKEN_SECONDS,
        out: Printer = print,
    ) -> None:
        self.cluster = cluster
        self.sim_root = sim_root
        self.workers = workers
        self.token_seconds = token_seconds
        self._out = out
        self.pools = {n.name: NodePool(n) for n in nodes}
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._local = threading.local()
        self.in_place = True
        self.counter_sets_per_slice = slices.MAX_COUNTER_SETS

    def set_layout(self, *, in_place: bool = True, counter_sets_per_slice: int = slices.MAX_COUNTER_SETS) -> None:
        """How every publisher writes from the next pass on (``SlicePublisher``'s options; the
        defaults are production's, ``False``/``1`` the behaviour before the fleet-scale fixes)."""
        self.in_place = in_place
        self.counter_sets_per_slice = counter_sets_per_slice

    # --- identities ----------------------------------------------------------------------------------
    def mint_identities(self) -> None:
        """For every node: a stand-in driver pod bound to it and a token bound to that pod."""
        identity.wait_service_account(self.cluster.api, identity.NAMESPACE, identity.DRIVER_SA)

        def mint(pool: NodePool) -> None:
            pod = identity.stand_in_pod(self.cluster.api, identity.NAMESPACE, identity.DRIVER_SA, pool.node.name)
            pool.token = identity.request_token(
                self.cluster.api, identity.NAMESPACE, identity.DRIVER_SA, bound_pod=pod, seconds=self.token_seconds
            )

        fleet.parallel(
            list(self.pools.values()), mint, what="driver identities (pod + token)", workers=self.workers, out=self._out
        )

    def remove_identities(self) -> None:
        """Delete the stand-in driver pods (their tokens stop working with them)."""
        core = client.CoreV1Api(self.cluster.api)

        def remove(pool: NodePool) -> None:
            name = f"{identity.DRIVER_SA}-identity-{pool.node.name}"[:253]
            try:
                core.delete_namespaced_pod(name, identity.NAMESPACE, grace_period_seconds=0)
            except client.ApiException as err:
                if err.status != 404:
                    raise
            pool.token = ""

        fleet.parallel(
            list(self.pools.values()), remove, what="driver identities removed", workers=self.workers, out=self._out
        )

    def whoami(self, node: str) -> dict[str, Any]:
        """What the API server authenticates ``node``'s publisher as (to show the identity in use)."""
        api = self.client_for(self.pools[node].token)
        try:
            return identity.whoami(api)
        finally:
            _close(api)

    def client_for(self, token: str) -> client.ApiClient:
        """A new API client authenticating with ``token`` (close it when done)."""
        admin = self.cluster.api.configuration
        cfg = client.Configuration()
        cfg.host = admin.host
        cfg.ssl_ca_cert = admin.ssl_ca_cert
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(cfg)

    # --- hardware --------------------------------------------------------------------------------------
    def discover(
        self,
        *,
        mig_placements: bool = True,
        mig_offer: Mapping[str, Collection[str]] | None = None,
        names_: Sequence[str] | None = None,
    ) -> None:
        """Per node (every node, or ``names_``): the simulator, then the driver's discovery (whole GPUs only when
        not ``mig_placements``; with ``mig_offer``, MIG placements only on each node's offered GPUs, as the
        driver publishes under the controller's MIG offer)."""

        def run(pool: NodePool) -> None:
            node = pool.node
            cfg = SimConfig(
                profile=node.profile,
                state_dir=self.sim_root / node.name,
                node_name=node.name,
                cluster_uuid=node.cluster_uuid,
                clique_id=1 if node.cluster_uuid else None,
                durable=False,
            )
            backend = Simulator(cfg)
            backend.init()
            offer = None if mig_offer is None else mig_offer.get(node.name, ())
            try:
                pool.inventory = inventory_mod.discover(
                    node.name, backend, mig_placements=mig_placements, mig_offer=offer
                )
            finally:
                backend.shutdown()

        what = (
            "discovery"
            + ("" if mig_placements else " (whole GPUs only)")
            + ("" if mig_offer is None else " (MIG offer)")
        )
        chosen = [self.pools[n] for n in (names_ if names_ is not None else list(self.pools))]
        fleet.parallel(chosen, run, what=what, workers=self.workers, out=self._out)

    def set_taints(self, node: str, taints: Mapping[str, Sequence[DeviceTaint]]) -> None:
        """The device taints ``node``'s health watcher would report now (GPU device name -> taints)."""
        self.pools[node].taints = {gpu: tuple(t) for gpu, t in taints.items()}

    # --- publishing -----------------------------------------------------------------------------------
    def publish(self, names_: Sequence[str] | None = None, *, what: str = "publish") -> PublishPass:
        """One publish pass (every node, or ``names_``): each node's publisher brings its pool up to date."""
        chosen = [self.pools[n] for n in (names_ if names_ is not None else list(self.pools))]
        with self._lock:
            self._counts = {}
        started = time.monotonic()
        written = fleet.parallel(chosen, self._publish_one, what=what, workers=self.workers, out=self._out)
        took = time.monotonic() - started
        devices = sum(p.publisher.devices_published for p in chosen if p.publisher is not None)
        slices_ = sum(
            len(inventory_pool_specs(p, self.counter_sets_per_slice))
            for p in chosen
            if p.inventory is not None and p.publisher is not None
        )
        with self._lock:
            calls = dict(self._counts)
        return PublishPass(
            nodes=len(chosen), written=sum(written), seconds=took, calls=calls, devices=devices, slices=slices_
        )

    def _publish_one(self, pool: NodePool) -> bool:
        if pool.inventory is None:
            raise RuntimeError(f"node {pool.node.name}: discover() before publish()")
        if not pool.token:
            raise RuntimeError(f"node {pool.node.name}: mint_identities() before publish()")
        api = self.client_for(pool.token)
        try:
            counted = CountingSliceApi(KubeApi(api), self._counts, self._lock)
            if pool.publisher is None:
                pool.publisher = SlicePublisher(counted, pool.node.name, names.DRIVER_NAME, taints=lambda: pool.taints)
            pool.publisher.api = counted
            pool.publisher.in_place = self.in_place
            pool.publisher.counter_sets_per_slice = self.counter_sets_per_slice
            return pool.publisher.publish(pool.inventory)
        finally:
            _close(api)

    def unpublish(self) -> None:
        """Delete every node's slices (each under its own identity)."""

        def run(pool: NodePool) -> None:
            if pool.publisher is None or not pool.token:
                return
            api = self.client_for(pool.token)
            try:
                pool.publisher.api = CountingSliceApi(KubeApi(api), self._counts, self._lock)
                pool.publisher.unpublish()
            finally:
                _close(api)

        fleet.parallel(list(self.pools.values()), run, what="slices deleted", workers=self.workers, out=self._out)

    def remove_simulators(self) -> None:
        """Delete the simulators' state directories."""
        shutil.rmtree(self.sim_root, ignore_errors=True)


def _close(api: client.ApiClient) -> None:
    close: Callable[[], None] = api.close
    close()


def inventory_pool_specs(
    pool: NodePool, counter_sets_per_slice: int = slices.MAX_COUNTER_SETS
) -> tuple[dict[str, Any], ...]:
    """The slice specs ``pool`` publishes now (the builder's output for its inventory and taints)."""
    assert pool.inventory is not None
    content = slices.build_pool(pool.inventory, names.DRIVER_NAME, pool.taints, counter_sets_per_slice)
    return content.slice_specs
