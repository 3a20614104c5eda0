"""A model of what kube-scheduler v1.36 does with gpuplane's ResourceSlices, for the placement benchmark.

Read from the sources (k8s.io/kubernetes v1.36.3, k8s.io/dynamic-resource-allocation v0.36.3), for a
pod with one ResourceClaim and no CPU/memory requests, on nodes without taints, images or topology
labels, under the default profile and the e2e control plane's feature gates:

* **Which nodes are looked at** (``schedule_one.go``): ``numFeasibleNodesToFind``: every node below
  100 nodes, else ``max(100, N * max(5, 50 - N/125) / 100)`` (125 nodes -> 100, 252 -> 120), taken in
  node-tree order from ``nextStartNodeIndex``, which then advances by the nodes processed.
* **Which nodes fit** (DynamicResources Filter): the allocator (``structured/internal/incubating``,
  the variant ``NewAllocator`` selects for the feature set {AdminAccess, PrioritizedList,
  PartitionableDevices, DeviceTaints, DeviceBindingAndStatus, ConsumableCapacity}: stable lacks the
  last two, ``DRAListTypeAttributes`` that would need ``experimental`` is off) finds a device.
* **Which node wins**: of the default plugins only NodeResourcesFit (LeastAllocated, weight 1)
  tells these nodes apart. It scores cpu and memory with the non-zero defaults for a pod without
  requests (100m, 200 MiB): ``((alloc - req) * 100) / alloc`` per resource, integer division, then
  the mean. BalancedAllocation scores a best-effort pod 0; TaintToleration, NodeAffinity, ImageLocality,
  PodTopologySpread (no default constraints for a pod without an owning Service/ReplicaSet),
  InterPodAffinity and VolumeBinding give every node the same score; DynamicResources scores only
  claims with ``firstAvailable`` subrequests. Ties: the root of Go's ``container/heap`` built over the
  feasible nodes in the order found (``Randomizer`` is only set by extenders, so it is 0). The net
  effect is **spread by pod count**, quantised into steps of about six pods.
* **Which device on that node** (``allocateOne``): pools sorted by id, a pool's slices sorted by
  *name*, devices in slice order; the first device that matches and whose counters fit. The order
  is read from the driver's own ``build_pool``/``render_slices`` on a simulated node, so it follows
  whatever ``gpuplane/driver/publish`` decides. Today's HGX pool names its slices ``-0`` .. ``-4``
  (one slice of the eight counter sets, then four device slices of two GPUs each): the walk visits
  GPUs 0 to 7, each profile's placements in ascending start. (Before the counter sets were packed,
  ``-0`` .. ``-11`` with ``-10`` sorting before ``-8``: GPUs 4-7 before 0-3; a node's GPUs are
  identical, so the figures should not depend on which comes first.)

Multi-member gangs (TP groups across nodes) are not the default path: the gpuplane controller
places them (GpuGang) with the gpuplane policy in every variant here.

Steering variants (``node_choice``, ``device_order``, ``withhold``) replace one part each:
``gpuplane`` node choice is the controller's gate-and-steer (gpuplane's policy on the cluster
snapshot, holding when it holds); ``preference`` device order is the driver publishing each
profile's placements in gpuplane's order for the node's state (``placement.preference``);
``withhold`` taints the placements that always strand compute so the allocator skips them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.kube.kube_walk import WalkOrder, published_walk, walk_of, walks_for
from gpuplane.placement import fragmentation, geometry, model, place, preference, snapshot
from gpuplane.placement.policies import gpuplane

GIB = 1 << 30
MIB = 1 << 20
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5


@dataclass(frozen=True)
class Scoring:
    """NodeResourcesFit LeastAllocated for pods without requests (the scheduler's non-zero defaults)."""

    node_cpu_milli: int = 64_000  # the e2e stand-in nodes' allocatable (e2e.plane.nodes.DEFAULT_CAPACITY)
    node_memory: int = 512 * GIB
    pod_cpu_milli: int = 100  # schedutil.DefaultMilliCPURequest
    pod_memory: int = 200 * MIB  # schedutil.DefaultMemoryRequest
    base_pods: int = 1  # pods on every node besides the workload's (the driver's pod)

    def score(self, pods_after: int) -> int:
        """LeastAllocated score of a node that holds ``pods_after`` workload pods once this one is added."""
        n = pods_after + self.base_pods
        cpu = _least(n * self.pod_cpu_milli, self.node_cpu_milli)
        mem = _least(n * self.pod_memory, self.node_memory)
        return (cpu + mem) // 2


def _least(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return ((capacity - requested) * 100) // capacity


def feasible_to_find(nodes: int, percentage: int = 0) -> int:
    """``numFeasibleNodesToFind`` for a profile without ``percentageOfNodesToScore``."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    pct = percentage or max(MIN_FEASIBLE_PERCENT, 50 - nodes // 125)
    return max(MIN_FEASIBLE_NODES, nodes * pct // 100)


def heap_root(scores: Sequence[int]) -> int:
    """Index of the element Go's ``heap.Init`` + ``Pop`` returns for a max-heap on ``scores`` (no randomizer)."""
    idx = list(range(len(scores)))
    n = len(idx)

    def less(a: int, b: int) -> bool:
        return scores[idx[a]] > scores[idx[b]]

    for i0 in range(n // 2 - 1, -1, -1):
        i = i0
        while True:
            j1 = 2 * i + 1
            if j1 >= n:
                break
            j = j1
            j2 = j1 + 1
            if j2 < n and less(j2, j1):
                j = j2
            if not less(j, i):
                break
            idx[i], idx[j] = idx[j], idx[i]
            i = j
    return idx[0]


@dataclass
class _NodeInfo:
    node: model.Node
    states: tuple[int, ...]
    fits: dict[str, bool] = field(default_factory=dict)


class KubeScheduler:
    """kube-scheduler + DRA allocator over gpuplane's slices, with optional gpuplane steering.

    A stateful placer for the benchmark: ``place`` decides, ``allocated``/``released`` keep the pod
    counts per node that the scheduler's scoring sees (one pod per gang member).
    """

    def __init__(
        self,
        name: str,
        walks: Mapping[int, WalkOrder],
        mix: fragmentation.SizeMix | None,
        *,
        node_choice: str = "scheduler",
        device_order: str = "published",
        withhold: bool = False,
        scoring: Scoring | None = None,
        driver_mix: fragmentation.SizeMix | None = None,
        queue: str = "controller",
    ) -> None:
        if node_choice not in ("scheduler", "gpuplane") or device_order not in ("published", "preference"):
            raise ValueError(f"unknown variant {node_choice}/{device_order}")
        if queue not in ("controller", "scheduler"):
            raise ValueError(f"unknown queue {queue!r}")
        # Steering with queue="scheduler": a pod the controller cannot place now is released (gate lifted,
        # not narrowed) and waits in the scheduler's queue, which places it by its own node choice later.
        self.queue = queue
        self.released_to_scheduler: set[str] = set()
        self.name = name
        self.walks = walks  # GPUs per node -> walk order
        self.node_choice = node_choice
        self.device_order = device_order
        self.scoring = scoring or Scoring()
        self.withheld = preference.hopper_stranding() if withhold else frozenset()
        self.controller = gpuplane.GpuPlane(mix)  # the controller: gangs, and node choice when steering
        self.driver = gpuplane.GpuPlane(driver_mix if driver_mix is not None else mix)  # never sees the queue
        self.pods: dict[str, int] = {}
        self._next_start = 0
        self._info: dict[str, _NodeInfo] = {}
        self._order: list[tuple[int, int]] | None = None
        self.decisions = 0
        self.steered_device_agrees = 0

    # --- harness hooks -------------------------------------------------------------------

    def observe_queue(self, waiting: Mapping[fragmentation.Shape, int]) -> None:
        """The controller knows its queue (gated pods); the scheduler's scoring does not use it."""
        self.controller.observe_queue(waiting)

    def allocated(self, d: model.Decision) -> None:
        """Count the decision's pods on their nodes."""
        for m in d.members:
            self.pods[m.node] = self.pods.get(m.node, 0) + 1

    def released(self, d: model.Decision) -> None:
        """Forget the decision's pods."""
        for m in d.members:
            self.pods[m.node] -= 1

    # --- deciding ------------------------------------------------------------------------

    def place(self, request: model.Request, snap: snapshot.Snapshot) -> model.Decision:
        """Where the scheduler (or, steered, the controller then the scheduler) puts ``request``."""
        self.decisions += 1
        if request.members > 1:
            return place.place(request, snap, self.controller)  # a GpuGang: the controller places it
        reason = place.check(request, snap)
        if reason:
            return model.Decision.refused(request.id, reason)
        if self.node_choice == "gpuplane" and request.id not in self.released_to_scheduler:
            d = place.place(request, snap, self.controller)
            if not d.placed:
                if self.queue == "controller":
                    return d  # held (gated) by the controller until it fits
                self.released_to_scheduler.add(request.id)
                return self._schedule(request, snap)
            target = d.members[0].node
            di, ni = self._locate(snap, target)
            got = self._device(request, snap, di, ni)
            if got is None:
                return model.Decision.refused(request.id, f"node {target} has no fitting device")
            if got == d.members[0]:
                self.steered_device_agrees += 1
            return model.Decision(request.id, (got,))
        return self._schedule(request, snap)

    def _locate(self, snap: snapshot.Snapshot, node: str) -> tuple[int, int]:
        for di, d in enumerate(snap.domains):
            for ni, n in enumerate(d.nodes):
                if n.name == node:
                    return di, ni
        raise KeyError(node)

    def _tree(self, snap: snapshot.Snapshot) -> list[tuple[int, int]]:
        if self._order is None:
            self._order = [(di, ni) for di, d in enumerate(snap.domains) for ni in range(len(d.nodes))]
        return self._order

    def _node_info(self, node: model.Node, slots: geometry.Slots) -> _NodeInfo:
        got = self._info.get(node.name)
        if got is None or got.node is not node:
            got = _NodeInfo(node, tuple(slots.state_of(g.whole, g.mig) for g in node.gpus))
            self._info[node.name] = got
        return got

    def _fits(self, request: model.Request, info: _NodeInfo, slots: geometry.Slots) -> bool:
        if request.mig_profile is None:
            return info.node.free_whole >= request.gpus_per_member
        p = request.mig_profile
        got = info.fits.get(p)
        if got is None:
            got = any(
                (p, s) not in self.withheld for st in info.states if st != geometry.WHOLE for s in slots.starts(st, p)
            )
            info.fits[p] = got
        return got

    def _candidates(
        self, request: model.Request, snap: snapshot.Snapshot
    ) -> tuple[list[tuple[int, int]], list[int], int]:
        """(feasible nodes in the order found, their scores, nodes processed) for one scheduling cycle."""
        tree = self._tree(snap)
        n = len(tree)
        want = feasible_to_find(n)
        slots = snap.slots
        feasible: list[tuple[int, int]] = []
        processed = 0
        for i in range(n):
            di, ni = tree[(self._next_start + i) % n]
            processed += 1
            info = self._node_info(snap.domains[di].nodes[ni], slots)
            if self._fits(request, info, slots):
                feasible.append((di, ni))
                if len(feasible) == want:
                    break
        scores = [self.scoring.score(self.pods.get(snap.domains[di].nodes[ni].name, 0) + 1) for di, ni in feasible]
        return feasible, scores, processed

    def best_nodes(self, request: model.Request, snap: snapshot.Snapshot) -> tuple[set[str], str]:
        """The nodes tied at the highest score, and the one Go's heap picks (for decision-by-decision checks)."""
        feasible, scores, _ = self._candidates(request, snap)
        if not feasible:
            return set(), ""
        top = max(scores)
        names = [snap.domains[di].nodes[ni].name for di, ni in feasible]
        return {nm for nm, sc in zip(names, scores, strict=True) if sc == top}, names[heap_root(scores)]

    def _schedule(self, request: model.Request, snap: snapshot.Snapshot) -> model.Decision:
        feasible, scores, processed = self._candidates(request, snap)
        self._next_start = (self._next_start + processed) % len(self._tree(snap))
        if not feasible:
            return model.Decision.refused(request.id, "0/N nodes are available: cannot allocate all claims")
        pick = feasible[0] if len(feasible) == 1 else feasible[heap_root(scores)]
        got = self._device(request, snap, *pick)
        if got is None:  # cannot happen: _fits said yes
            raise AssertionError(f"node {snap.domains[pick[0]].nodes[pick[1]].name} fits but has no device")
        return model.Decision(request.id, (got,))

    def _device(
        self, request: model.Request, snap: snapshot.Snapshot, di: int, ni: int
    ) -> model.MemberPlacement | None:
        """The allocator's walk on one node: the first device that fits in the published order."""
        dom = snap.domains[di]
        node = dom.nodes[ni]
        slots = snap.slots
        walk = self.walks[len(node.gpus)]
        if request.mig_profile is None:
            want = request.gpus_per_member
            order = walk.whole if self.device_order == "published" else tuple(range(len(node.gpus)))
            picked = [k for k in order if node.gpus[k].empty][:want]
            if len(picked) < want:
                return None
            return model.MemberPlacement(0, node.name, dom.name, gpus=tuple(node.gpus[k].id for k in picked))
        p = request.mig_profile
        info = self._node_info(node, slots)
        choice: tuple[int, int] | None = None
        if self.device_order == "published":
            for k, s in walk.mig.get(p, ()):
                st = info.states[k]
                if (p, s) not in self.withheld and st != geometry.WHOLE and slots.fits(st, p, s):
                    choice = (k, s)
                    break
        else:
            choice = preference.best_on_node(self.driver, slots, info.states, p, self.withheld)
        if choice is None:
            return None
        k, s = choice
        return model.MemberPlacement(0, node.name, dom.name, mig=(model.MigSlot(node.gpus[k].id, p, s),))


def variants(mix: fragmentation.SizeMix, walks: Mapping[int, WalkOrder]) -> dict[str, KubeScheduler]:
    """The default path today and the steering levers, alone and together (fresh placers)."""
    return {
        "kube-scheduler (today)": KubeScheduler("kube-scheduler (today)", walks, mix),
        "+ withhold": KubeScheduler("+ withhold", walks, mix, withhold=True),
        "+ order": KubeScheduler("+ order", walks, mix, device_order="preference"),
        "+ order + withhold": KubeScheduler("+ order + withhold", walks, mix, device_order="preference", withhold=True),
        "+ node": KubeScheduler("+ node", walks, mix, node_choice="gpuplane"),
        "+ steering, driver on the prior mix": KubeScheduler(
            "+ steering, driver on the prior mix",
            walks,
            mix,
            node_choice="gpuplane",
            device_order="preference",
            withhold=True,
            driver_mix=gpuplane.PRIOR_MIX,
        ),
        "+ steering, queue in the controller": KubeScheduler(
            "+ steering, queue in the controller",
            walks,
            mix,
            node_choice="gpuplane",
            device_order="preference",
            withhold=True,
            queue="controller",
        ),
        # What gpuplane/controller/steer does: a pod that cannot be placed now is released to the scheduler.
        "kube-scheduler + gpuplane steering": KubeScheduler(
            "kube-scheduler + gpuplane steering",
            walks,
            mix,
            node_choice="gpuplane",
            device_order="preference",
            withhold=True,
            queue="scheduler",
        ),
    }


__all__ = [
    "KubeScheduler",
    "Scoring",
    "WalkOrder",
    "feasible_to_find",
    "heap_root",
    "published_walk",
    "variants",
    "walk_of",
    "walks_for",
]
