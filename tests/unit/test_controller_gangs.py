"""Controller gang logic without a cluster: slices come from the real driver code on the simulator.

Covers: snapshot building from published slices, all-or-nothing apply steps,
idempotent re-apply after a crash mid-apply, TP refusal with the reason,
preemption victims (never equal priority), DRF ordering, status coalescing,
claim validation messages, and node label derivation.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuplane.controller import names
from gpuplane.controller.claim import checks, selectors
from gpuplane.controller.gang import desired, placement_record, queue_runner, reconciler, status, world, writes
from gpuplane.controller.gang.spec import GangSpec
from gpuplane.controller.node import labels, snapshot_builder
from gpuplane.controller.placement.policies import make as make_policy
from gpuplane.driver.hw.sim import SimConfig, Simulator
from gpuplane.driver.publish import inventory, slices

T0 = 1_700_000_000.0
CLUSTER = "6a1c4a2e-9a53-4a44-9a3c-3a1c4a2e9a53"


# --- builders -------------------------------------------------------------------------------


def node_slices(tmp: Path, node: str, profile: str, clique: int | None = None) -> list[dict[str, Any]]:
    """The ResourceSlices the real driver publishes for a simulated node."""
    cfg = SimConfig(
        profile=profile,
        state_dir=tmp / node,
        node_name=node,
        durable=False,
        cluster_uuid=CLUSTER if clique is not None else None,
        clique_id=clique,
    )
    (tmp / node).mkdir(parents=True, exist_ok=True)
    with Simulator(cfg) as sim:
        inv = inventory.discover(node, sim)
    return slices.render_slices(slices.build_pool(inv), 1)


@pytest.fixture(scope="module")
def cluster_slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sim")
    out: list[dict[str, Any]] = []
    for i in range(2):
        out += node_slices(tmp, f"hgx-{i}", "hgx-h100")
    for i in range(4):
        out += node_slices(tmp, f"nvl-{i}", "gb200-nvl72", clique=1)
    return out


def gang_body(
    name: str, ns: str = "team-a", created: float = T0, status_: Mapping[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": names.GANG_API_VERSION,
        "kind": names.GANG_KIND,
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": status.now_rfc3339(created),
        },
        "spec": spec,
        "status": dict(status_ or {}),
    }


def member_pod(
    gang: str,
    i: int,
    *,
    ns: str = "team-a",
    gated: bool = True,
    node: str = "",
    affinity: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "gpus", "resourceClaimName": f"{gang}-{i}"}],
        "schedulingGates": [{"name": names.SCHEDULING_GATE}] if gated else [],
    }
    if node:
        spec["nodeName"] = node
    if affinity:
        spec["affinity"] = affinity
    return {
        "metadata": {
            "name": f"{gang}-pod-{i}",
            "namespace": ns,
            "uid": f"pod-{gang}-{i}",
            "labels": {names.LABEL_GANG: gang},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


GB200 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA GB200"'
H100 = 'device.attributes["gpu.gpuplane.dev"].productName == "NVIDIA H100 80GB HBM3"'
GPU_CLASS = {
    "metadata": {"name": "gpu.gpuplane.dev"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.gpuplane.dev" && '
                    'device.attributes["gpu.gpuplane.dev"].type == "gpu"'
                }
            }
        ]
    },
}
MIG_CLASS = {
    "metadata": {"name": "mig.gpuplane.dev"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.gpuplane.dev" && '
                    'device.attributes["gpu.gpuplane.dev"].type == "mig"'
                }
            }
        ]
    },
}
CLASSES = {"gpu.gpuplane.dev": GPU_CLASS, "mig.gpuplane.dev": MIG_CLASS}


def make_world(
    slices_: Sequence[Mapping[str, Any]],
    gangs_: Sequence[dict[str, Any]],
    pods: Sequence[dict[str, Any]] = (),
    claims_: Sequence[dict[str, Any]] = (),
) -> world.World:
    return world.World(
        gangs={f"{g['metadata']['namespace']}/{g['metadata']['name']}": g for g in gangs_},
        pods=world.member_lists(pods),
        claims={f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims_},
        slices=tuple(slices_),
        nodes={s["spec"]["nodeName"]: True for s in slices_},
        classes=CLASSES,
    )


def run_pass(w: world.World, now: float = T0 + 10) -> tuple[queue_runner.Plan, snapshot_builder.ClusterView]:
    view = world.cluster_view(w)
    entries = world.entries(w, view)
    compiled = {e.key: world.admit_for(w, e.spec) for e in entries}
    plan = queue_runner.plan(entries, view, lambda e: compiled[e.key].predicate, make_policy("gpuplane"), now=now)
    return plan, view


def decide(w: world.World, key: str, now: float = T0 + 10) -> reconciler.Outcome:
    plan, view = run_pass(w, now)
    return reconciler.decide(
        key, w.gangs[key], w, view=view, plan=plan, now=now, settings=reconciler.Settings(eviction_grace_s=0)
    )


class FakeApi:
    """Applies steps to in-memory pods and claims, with an optional crash after N writes."""

    def __init__(self, w: world.World, crash_after: int | None = None) -> None:
        self.pods = {p["metadata"]["name"]: copy.deepcopy(dict(p)) for ps in w.pods.values() for p in ps}
        self.claims: dict[str, dict[str, Any]] = {
            c["metadata"]["name"]: copy.deepcopy(dict(c)) for c in w.claims.values()
        }
        self.writes: list[str] = []
        self.crash_after = crash_after

    def run(self, step: writes.Step) -> None:
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            raise RuntimeError("crash")
        self.writes.append(f"{step.kind} {step.name}")
        if step.kind == "create-claim":
            assert step.name not in self.claims, f"claim {step.name} created twice"
            self.claims[step.name] = step.body
        elif step.kind == "delete-claim":
            self.claims.pop(step.name, None)
        elif step.kind == "patch-pod":
            pod = self.pods[step.name]
            for op in step.body:
                field = op["path"].rsplit("/", 1)[1]
                if op["op"] == "test":
                    assert pod["spec"].get(field, []) == op["value"], "json-patch test failed"
                else:
                    pod["spec"][field] = op["value"]
        elif step.kind == "delete-pod":
            self.pods.pop(step.name, None)
        elif step.kind == "wait":
            raise RuntimeError(step.why)


def apply_all(api: FakeApi, steps: Sequence[writes.Step]) -> bool:
    for step in steps:
        try:
            api.run(step)
        except RuntimeError:
            return False
    return True


def gang_world(cluster_slices: list[dict[str, Any]], body: dict[str, Any], n: int) -> world.World:
    name = body["metadata"]["name"]
    return make_world(cluster_slices, [body], [member_pod(name, i) for i in range(n)])


# --- snapshot and labels -------------------------------------------------------------------------


def test_view_reads_domains_from_real_slices(cluster_slices: list[dict[str, Any]]) -> None:
    view = snapshot_builder.build_view(cluster_slices)
    snap = view.snapshot()
    sizes = sorted(d.gpu_count for d in snap.domains)
    assert sizes == [8, 8, 16]  # two HGX nodes, one NVL72 clique of 4 nodes x 4 GPUs
    assert snap.max_domain_gpus == 16
    assert "3g" in view.profiles.values()


def test_node_label_from_slices(cluster_slices: list[dict[str, Any]]) -> None:
    hgx = labels.desired(labels.domains_of_node("hgx-0", cluster_slices))
    nvl = [labels.desired(labels.domains_of_node(f"nvl-{i}", cluster_slices)).label for i in range(4)]
    assert hgx.label == "hgx-0.nvl0"
    assert len(set(nvl)) == 1 and nvl[0] == f"{CLUSTER}.1"
    node = {"metadata": {"name": "hgx-0", "labels": {names.NODE_LABEL_NVLINK_DOMAIN: "stale"}}}
    assert labels.patch_for(node, hgx) == {"metadata": {"labels": {names.NODE_LABEL_NVLINK_DOMAIN: "hgx-0.nvl0"}}}
    node["metadata"]["labels"][names.NODE_LABEL_NVLINK_DOMAIN] = "hgx-0.nvl0"
    assert labels.patch_for(node, hgx) is None
    assert labels.desired({"a", "b"}) == labels.NodeDomains(label=None, annotation="a,b")


def test_selector_prefilter() -> None:
    c = selectors.compile_all([GB200, 'device.attributes["x.y"].n >= 3 && !(device.driver != "d")', "size(x) > 1"])
    assert c.unsupported == ("size(x) > 1",)
    assert c.predicate("d", {"gpu.gpuplane.dev/productName": "NVIDIA GB200", "x.y/n": 3})
    assert not c.predicate("d", {"gpu.gpuplane.dev/productName": "NVIDIA GB200", "x.y/n": 2})
    assert not c.predicate("d", {"x.y/n": 5})  # missing attribute: no match


# --- gang placement -----------------------------------------------------------------------------


def test_tp8_gang_lands_in_one_nvl72_clique_all_or_nothing(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    w = gang_world(cluster_slices, body, 2)
    out = decide(w, "team-a/train")
    assert out.status["phase"] == "Placing"
    placement = out.status["placement"]
    assert placement["domains"] == [f"{CLUSTER}.1"]
    assert set(placement["members"].values()) <= {f"nvl-{i}" for i in range(4)}
    kinds = [s.kind for s in out.steps]
    # claims first, then affinities, then gates: gates never before every claim exists
    assert kinds == ["create-claim"] * 2 + ["patch-pod"] * 4
    claim = out.steps[0].body
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    exprs = [s["cel"]["expression"] for s in claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    assert any(f'nvlinkDomain == "{CLUSTER}.1"' in e for e in exprs)
    assert claim["spec"]["devices"]["constraints"] == [
        {"requests": ["gpus"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}
    ]


def test_gang_waits_for_all_members(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8)
    w = make_world(cluster_slices, [body], [member_pod("train", 0)])
    out = decide(w, "team-a/train")
    assert out.status["phase"] == "Pending" and not out.steps
    assert "1 of 2" in out.status["message"]


def test_tp16_on_h100_is_refused_with_reason(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("big", members=2, gpusPerMember=8, tensorParallelSize=16, selectors=[H100])
    out = decide(gang_world(cluster_slices, body, 2), "team-a/big")
    assert out.status["phase"] == "Unschedulable"
    assert "TP size 16 exceeds the largest NVLink domain (8 GPUs)" in out.status["message"]
    assert not out.steps
    assert ("Warning", "Unschedulable", out.status["message"]) in out.events


def test_crash_mid_apply_converges_without_duplicates(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=4, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    w = gang_world(cluster_slices, body, 4)
    first = decide(w, "team-a/train")
    total = len(first.steps)
    for crash_at in range(total):
        api = FakeApi(w, crash_after=crash_at)
        assert not apply_all(api, first.steps)
        # The status (decision) was written first; rebuild the world from the "API" and go on.
        st = {**body["status"], **{k: v for k, v in first.status.items() if v is not None}}
        w2 = make_world(
            cluster_slices,
            [gang_body("train", status_=st, **body["spec"])],
            list(api.pods.values()),
            [dict(c, status={}) for c in api.claims.values()],
        )
        again = decide(w2, "team-a/train")
        assert again.status["phase"] == "Placing" and "placement" not in again.status  # the decision stands
        api.crash_after = None
        assert apply_all(api, again.steps)
        assert len(api.writes) == total, f"crash at {crash_at}: {api.writes}"
        assert all(not p["spec"]["schedulingGates"] for p in api.pods.values())
        assert sorted(api.claims) == [f"train-{i}" for i in range(4)]
        w3 = make_world(
            cluster_slices,
            [gang_body("train", status_=st, **body["spec"])],
            list(api.pods.values()),
            [dict(c, status={}) for c in api.claims.values()],
        )
        assert decide(w3, "team-a/train").steps == ()


def test_gates_not_lifted_while_a_member_claim_is_foreign(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body("train", members=2, gpusPerMember=4, tensorParallelSize=8, selectors=[GB200])
    foreign = {"metadata": {"name": "train-1", "namespace": "team-a", "annotations": {}}, "spec": {}, "status": {}}
    w = make_world(cluster_slices, [body], [member_pod("train", i) for i in range(2)], [foreign])
    out = decide(w, "team-a/train")
    assert out.steps[-1].kind == "wait"
    assert not any(s.kind == "patch-pod" and "gate" in s.why for s in out.steps)


def test_narrowing_keeps_existing_terms() -> None:
    aff = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    out = desired.narrowed_affinity(aff, "n1")
    assert out is not None
    exprs = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    assert exprs == [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]},
    ]
    assert desired.narrowed_affinity(out, "n1") is None
    assert desired.pinned_elsewhere(out, "n2") == "n1"


# --- queue: fairness, aging, preemption ------------------------------------------------------------


def holding(
    name: str, ns: str, priority: int, nodes: Sequence[str], created: float, *, gpus: int = 4
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A placed gang whose claims are allocated on ``nodes`` (``gpus`` whole GPUs each)."""
    members = {str(i): n for i, n in enumerate(nodes)}
    devices = {str(i): ",".join(f"gpu-{k}" for k in range(gpus)) for i in range(len(nodes))}
    st = {"phase": "Scheduled", "placement": {"id": "x", "domains": [], "members": members, "devices": devices}}
    body = gang_body(
        name, ns=ns, created=created, status_=st, members=len(nodes), gpusPerMember=gpus, priority=priority
    )
    pods = [member_pod(name, i, ns=ns, gated=False, node=n) for i, n in enumerate(nodes)]
    claim_objs = []
    for i, n in enumerate(nodes):
        results = [
            {"driver": "gpu.gpuplane.dev", "pool": n, "device": f"gpu-{k}", "request": "gpus"} for k in range(gpus)
        ]
        claim_objs.append(
            {
                "metadata": {
                    "name": f"{name}-{i}",
                    "namespace": ns,
                    "labels": {names.LABEL_MEMBER_INDEX: str(i)},
                    "annotations": {names.ANNOTATION_DECISION: "x"},
                    "ownerReferences": [{"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": name}],
                },
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
    return body, pods, claim_objs


def test_preemption_picks_fewest_lower_priority_never_equal(cluster_slices: list[dict[str, Any]]) -> None:
    # The NVL72 clique is full: low (prio 0) holds nvl-0,1; mid (prio 5) holds nvl-2; eq (prio 10) holds nvl-3.
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1"], T0)
    mid = holding("mid", "team-b", 5, ["nvl-2"], T0)
    eq = holding("eq", "team-c", 10, ["nvl-3"], T0)
    hi = gang_body(
        "hi", members=2, gpusPerMember=4, tensorParallelSize=8, priority=10, selectors=[GB200], created=T0 + 5
    )
    gangs_ = [low[0], mid[0], eq[0], hi]
    pods = low[1] + mid[1] + eq[1] + [member_pod("hi", i) for i in range(2)]
    w = make_world(cluster_slices, gangs_, pods, low[2] + mid[2] + eq[2])
    plan, _ = run_pass(w)
    act = plan.actions["team-a/hi"]
    assert act.kind == "preempt"
    assert act.victims == ("team-b/low",)  # one victim frees 8 GPUs; 'eq' has equal priority: never
    # Equal priority only: no preemption at all.
    w2 = make_world(
        cluster_slices,
        [eq[0], gang_body("peer", members=2, gpusPerMember=4, tensorParallelSize=8, priority=10, selectors=[GB200])],
        eq[1] + [member_pod("peer", i) for i in range(2)] + [],
        eq[2],
    )
    full = holding("eq2", "team-c", 10, ["nvl-0", "nvl-1", "nvl-2"], T0)
    w2 = make_world(
        cluster_slices,
        [eq[0], full[0], w2.gangs["team-a/peer"]],
        eq[1] + full[1] + [member_pod("peer", i) for i in range(2)],
        eq[2] + full[2],
    )
    plan2, _ = run_pass(w2)
    assert plan2.actions["team-a/peer"].kind == "wait"


def test_preemptor_waits_until_capacity_is_really_free(cluster_slices: list[dict[str, Any]]) -> None:
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3"], T0)
    low[0]["status"]["phase"] = "Preempted"  # evicted, but its claims are still allocated
    hi = gang_body(
        "hi",
        members=2,
        gpusPerMember=4,
        tensorParallelSize=8,
        priority=10,
        selectors=[GB200],
        status_={"phase": "Queued", "nominatedVictims": ["team-b/low"]},
    )
    w = make_world(cluster_slices, [low[0], hi], [member_pod("hi", i) for i in range(2)], low[2])
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].kind == "await-victims"
    w_freed = make_world(cluster_slices, [low[0], hi], [member_pod("hi", i) for i in range(2)], [])
    plan, _ = run_pass(w_freed)
    assert plan.actions["team-a/hi"].kind == "place"


def test_drf_orders_equal_priority_by_dominant_share(cluster_slices: list[dict[str, Any]]) -> None:
    rich = holding("rich", "team-rich", 0, ["hgx-0"], T0, gpus=8)
    a = gang_body("a", ns="team-rich", members=1, gpusPerMember=8, created=T0 - 30)
    b = gang_body("b", ns="team-poor", members=1, gpusPerMember=8, created=T0)
    w = make_world(
        cluster_slices,
        [rich[0], a, b],
        rich[1] + [member_pod("a", 0, ns="team-rich"), member_pod("b", 0, ns="team-poor")],
        rich[2],
    )
    plan, _ = run_pass(w)
    assert plan.order == ("team-poor/b", "team-rich/a")  # older, but its namespace holds more


def test_aging_lifts_old_low_priority_gangs() -> None:
    spec = GangSpec(members=1, gpusPerMember=1, priority=0)
    e = queue_runner.Entry("ns/x", "ns", spec, created=T0, waiting_since=T0, ready=True, holding=False)
    s = queue_runner.Settings(aging_s=60, aging_cap=3)
    assert queue_runner.effective_priority(e, T0 + 59, s) == 0
    assert queue_runner.effective_priority(e, T0 + 130, s) == 2
    assert queue_runner.effective_priority(e, T0 + 10_000, s) == 3


# --- status coalescing --------------------------------------------------------------------------------


def pods_bound(gang: str, n: int, bound: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield member_pod(gang, i, gated=False, node="hgx-0" if i < bound else "")


def test_256_member_gang_status_writes_are_bounded(cluster_slices: list[dict[str, Any]]) -> None:
    n = 256
    placement = {
        "id": "p",
        "domains": ["d"],
        "members": {str(i): "hgx-0" for i in range(n)},
        "devices": {str(i): "" for i in range(n)},
    }
    decided = placement_record.decision_from_status("team-a/huge", placement, {})
    assert decided is not None
    member_claims = [
        {
            "metadata": {
                "name": f"huge-{i}",
                "namespace": "team-a",
                "annotations": {names.ANNOTATION_DECISION: placement_record.decision_id(decided)},
                "ownerReferences": [{"apiVersion": names.GANG_API_VERSION, "kind": names.GANG_KIND, "name": "huge"}],
            },
            "spec": {},
            "status": {},
        }
        for i in range(n)
    ]
    coal = status.Coalescer(min_interval_s=5.0)
    current: dict[str, Any] = {"phase": "Placed", "placement": placement}
    writes = 0
    t = T0
    for bound in range(n + 1):  # one pod event per member bind, 20 ms apart
        t += 0.02
        body = gang_body("huge", status_=current, members=n, migProfile="1g.10gb")
        w = make_world(cluster_slices, [body], list(pods_bound("huge", n, bound)), member_claims)
        out = decide(w, "team-a/huge", now=t)
        patch = status.merge_patch(current, out.status)
        if coal.admit("team-a/huge", patch, t):
            writes += 1
            current = {**current, **{k: v for k, v in patch.items() if v is not None}}
    assert current["phase"] == "Scheduled"
    assert writes <= 5, writes  # phase changes are immediate; counters at most every 5 s


# --- claims ------------------------------------------------------------------------------------------------


def claim_body(
    requests: list[dict[str, Any]],
    config: list[dict[str, Any]] | None = None,
    constraints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if config:
        devices["config"] = config
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": devices}, "status": {}}


def req(name: str, cls: str = "gpu.gpuplane.dev", count: int = 1, sel: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {"deviceClassName": cls, "count": count, "selectors": [{"cel": {"expression": s}} for s in sel]},
    }


def test_claim_config_validation_messages() -> None:
    bad = claim_body(
        [req("g")],
        [
            {
                "requests": ["g"],
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}},
                    },
                },
            }
        ],
    )
    problems = checks.validate(bad, CLASSES)
    assert len(problems) == 1 and "defaultActiveThreadPercentage" in problems[0] and "150" in problems[0]
    mig_ts = claim_body(
        [req("m", cls="mig.gpuplane.dev")],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "MigDeviceConfig",
                        "sharing": {"strategy": "TimeSlicing"},
                    },
                }
            }
        ],
    )
    assert "not supported on MIG" in checks.validate(mig_ts, CLASSES)[0]
    good = claim_body(
        [req("g")],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {"apiVersion": "gpu.gpuplane.dev/v1alpha1", "kind": "GpuConfig"},
                }
            }
        ],
    )
    assert checks.validate(good, CLASSES) == []


def test_multi_gpu_claim_without_domain_constraint_warns() -> None:
    bare = claim_body([req("g", count=4)])
    warning = checks.domain_warning(bare, CLASSES)
    assert warning and "matchAttribute: gpu.gpuplane.dev/nvlinkDomain" in warning
    ok = claim_body(
        [req("g", count=4)], constraints=[{"requests": ["g"], "matchAttribute": "gpu.gpuplane.dev/nvlinkDomain"}]
    )
    assert checks.domain_warning(ok, CLASSES) is None
    assert checks.domain_warning(claim_body([req("g", count=1)]), CLASSES) is None


def test_unallocated_mig_claim_is_explained(cluster_slices: list[dict[str, Any]]) -> None:
    view = snapshot_builder.build_view(cluster_slices)
    # Take a 4g on every H100 and GB200 GPU, leaving 3 compute slices: no 4g fits, 2g/3g do.
    taken = {g.id: (snapshot_builder.model.MigInstance("4g", 0),) for g in view.gpus}
    view = dataclasses.replace(view, taken_mig=taken)
    h100_4g = "4g.40gb"
    assert view.profiles[h100_4g] == "4g"
    c = claim_body(
        [req("m", cls="mig.gpuplane.dev", sel=[f'device.attributes["gpu.gpuplane.dev"].migProfile == "{h100_4g}"'])]
    )
    why = checks.explain_unallocated(c, CLASSES, view)
    assert f"no free placement for profile {h100_4g}" in why
    assert "largest free block per GPU is 3g" in why


def test_victim_choice_is_deterministic_and_minimal(cluster_slices: list[dict[str, Any]]) -> None:
    # Four one-node gangs fill the clique; a TP=8 gang needs two of them gone. Pick the two lowest priorities.
    parts = [holding(f"v{i}", "team-b", p, [f"nvl-{i}"], T0 + i) for i, p in enumerate([3, 1, 2, 1])]
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, priority=9, selectors=[GB200])
    pods = list(itertools.chain.from_iterable(p[1] for p in parts)) + [member_pod("hi", i) for i in range(2)]
    w = make_world(
        cluster_slices, [p[0] for p in parts] + [hi], pods, list(itertools.chain.from_iterable(p[2] for p in parts))
    )
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].victims == ("team-b/v1", "team-b/v3")


# --- released vs preempted --------------------------------------------------------------------------


def test_released_gang_stays_released_on_the_next_reconciles(cluster_slices: list[dict[str, Any]]) -> None:
    # e2e regression: a gang whose pods were all deleted went Running -> Released -> "Preempted" one
    # reconcile later, with no preemption anywhere (every gang had priority 0).
    body, _pods, claim_objs = holding("fill", "team-a", 0, ["nvl-0", "nvl-1"], T0)
    body["status"]["phase"] = "Running"
    out = decide(make_world(cluster_slices, [body], [], claim_objs), "team-a/fill")
    assert out.status["phase"] == "Released" and out.victims == ()
    assert [s.kind for s in out.steps] == ["delete-claim", "delete-claim"]
    for claims_left in (claim_objs, []):  # before and after the claims are really gone
        seen = {**body, "status": {**body["status"], **out.status}}
        again = decide(make_world(cluster_slices, [seen], [], claims_left), "team-a/fill", now=T0 + 20)
        assert again.status["phase"] == "Released", again.status
        assert again.events == () and again.victims == ()
        out = again


def test_preempted_gang_stays_preempted_until_its_pods_return(cluster_slices: list[dict[str, Any]]) -> None:
    body = gang_body(
        "low", members=2, gpusPerMember=4, status_={"phase": "Preempted", "reason": "Preempted", "message": "by hi"}
    )
    out = decide(make_world(cluster_slices, [body], []), "team-a/low")
    assert (out.status["phase"], out.status["reason"], out.events) == ("Preempted", "Preempted", ())
    back = decide(make_world(cluster_slices, [body], [member_pod("low", i) for i in range(2)]), "team-a/low")
    assert back.status["phase"] == "Placing"  # pods back and gated: queued again, and room is free


def test_victims_seen_through_the_preemptors_filter(cluster_slices: list[dict[str, Any]]) -> None:
    # A low-priority gang holds GPUs in both the clique and an HGX node; the GB200-only preemptor sees
    # (and frees) only its clique part, without tripping over the GPUs outside its filter.
    wide = holding("wide", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3", "hgx-0"], T0)
    hi = gang_body("hi", members=2, gpusPerMember=4, tensorParallelSize=8, priority=5, selectors=[GB200])
    w = make_world(cluster_slices, [wide[0], hi], wide[1] + [member_pod("hi", i) for i in range(2)], wide[2])
    plan, _ = run_pass(w)
    assert plan.actions["team-a/hi"].kind == "preempt" and plan.actions["team-a/hi"].victims == ("team-b/wide",)


def test_a_running_gang_is_nominated_by_one_preemptor_per_pass(cluster_slices: list[dict[str, Any]]) -> None:
    low = holding("low", "team-b", 0, ["nvl-0", "nvl-1", "nvl-2", "nvl-3"], T0)
    his = [
        gang_body(n, members=2, gpusPerMember=4, tensorParallelSize=8, priority=5, selectors=[GB200], created=T0 + i)
        for i, n in enumerate(("hi-a", "hi-b"))
    ]
    pods = low[1] + [member_pod(n, i) for n in ("hi-a", "hi-b") for i in range(2)]
    plan, _ = run_pass(make_world(cluster_slices, [low[0], *his], pods, low[2]))
    assert plan.actions["team-a/hi-a"].kind == "preempt" and plan.actions["team-a/hi-a"].victims == ("team-b/low",)
    assert plan.actions["team-a/hi-b"].kind == "wait"  # behind the preemptor; no second eviction


def test_selector_outside_the_prefilter_is_reported_once(cluster_slices: list[dict[str, Any]]) -> None:
    odd = 'device.attributes["gpu.gpuplane.dev"].productName.startsWith("NVIDIA")'
    body = gang_body("odd", members=1, gpusPerMember=1, selectors=[odd, H100])
    out = decide(gang_world(cluster_slices, body, 1), "team-a/odd")
    approx = [e for e in out.events if e[1] == "SelectorNotPrefiltered"]
    assert len(approx) == 1 and odd in approx[0][2] and H100 not in approx[0][2]
    seen = {**body, "status": out.status}
    again = decide(gang_world(cluster_slices, seen, 1), "team-a/odd", now=T0 + 20)
    assert not [e for e in again.events if e[1] == "SelectorNotPrefiltered"]
    plain = gang_body("plain", members=1, gpusPerMember=1, selectors=[H100])
    assert not [
        e
        for e in decide(gang_world(cluster_slices, plain, 1), "team-a/plain").events
        if e[1] == "SelectorNotPrefiltered"
    ]


def test_partial_share_without_sharing_strategy_is_flagged_before_scheduling() -> None:
    """A sharePercent < 100 on a plain exclusive claim is refused by the driver; the controller says so first."""
    shared = req("g")
    shared["exactly"]["capacity"] = {"requests": {"sharePercent": "50"}}
    problems = checks.validate(claim_body([shared]), CLASSES)
    assert len(problems) == 1 and "sharePercent 50" in problems[0] and "Exclusive" in problems[0]
    whole = req("g")
    whole["exactly"]["capacity"] = {"requests": {"sharePercent": "100"}}
    assert checks.validate(claim_body([whole]), CLASSES) == []
    timesliced = claim_body(
        [shared],
        [
            {
                "opaque": {
                    "driver": "gpu.gpuplane.dev",
                    "parameters": {
                        "apiVersion": "gpu.gpuplane.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing"},
                    },
                }
            }
        ],
    )
    assert checks.validate(timesliced, CLASSES) == []
