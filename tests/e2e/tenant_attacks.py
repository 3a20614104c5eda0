"""THE list of attacks one tenant tries on the others (issue 32), for tests/e2e/test_tenancy_adversarial.py.

Each :class:`Attack` says which defect of issue 32 it is (``+`` for one found while writing this list),
what the attacker does, and what the defence guarantees. Its ``run`` does it with the attacker's own token
and returns the evidence (the refusal the API server gave, or what was observed instead of an effect); it
raises AssertionError when the defence failed. After every attack the test checks the invariants on the
other tenants (tenantkit: nothing evicted, preempted, deleted, restarted, moved, unreadable to them, delayed
past the steering timeout). A new attack is one more entry of ``ATTACKS``; docs/tenancy.md lists them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from e2e.cluster import flags
from gpuplane.controller.steer import decide
from gpuplane.placement import model
from tests.e2e.conftest import eventually
from tests.e2e.tenant_imex import GROUPS_PER_NAMESPACE, group_bad_names, group_flood, group_squat
from tests.e2e.tenant_migoffer import PER_NAMESPACE, PODS, held_mig_flood, unplaceable_mig_flood
from tests.e2e.tenant_refusals import (
    controller_writes,
    grant_itself,
    node_slice,
    read_others,
    refused,
    scrape_metrics,
    status_writes,
)
from tests.e2e.tenantkit import (
    STEER_GATE,
    STEERED,
    Arena,
    G,
    V,
    claim,
    controller_rss_kib,
    gang,
    gang_status,
    outcome,
    pod,
    steered_in_time,
    whole_gpu_template,
)

HIGH = flags.ENTITLED_PRIORITY_CLASSES[0]  # exists; no tenant here was granted it (no ResourceQuota scoped to it)
BLOB = 250_000  # bytes of a tenant's own annotation: close to the API server's 256 KiB limit
FLOOD = 70  # more than the 64 writes of a steering pass
OVERSIZED = 160  # unbound claim pods of BLOB bytes each: 39 MiB


@dataclasses.dataclass(frozen=True)
class Attack:
    name: str
    defect: str  # issue 32's defect number; "+" for an attack found while writing the list
    action: str
    expected: str
    run: Callable[[Arena], str]


# --- defect 1: priority ------------------------------------------------------------------------------------


def gang_spec_priority(arena: Arena) -> str:
    a = arena.attacker
    # Named like the victim's gang, its member claims squatted first under the names the controller gives them.
    for body in (claim(a.ns, "train-0", "gpu.gpuplane.dev"), *gang(a.ns, "train", spec_priority=1_000_000)):
        a.must_create(body)
    st = eventually(lambda: (s := gang_status(arena.gc, a.ns, "train")).get("reason") and s, 90, "the gang decided")
    time.sleep(8)  # several queue passes
    st = gang_status(arena.gc, a.ns, "train")
    assert st.get("phase") != "Running" and not st.get("nominatedVictims"), st
    return f"attacker's gang {st.get('phase')}: {st.get('reason')}: {str(st.get('message'))[:120]}"


def priority_class_not_granted(arena: Arena) -> str:
    a = arena.attacker
    body = pod(a.ns, "wants-high", claim_name="none")
    body["spec"]["priorityClassName"] = HIGH
    return refused(outcome(lambda: a.core.create_namespaced_pod(a.ns, cast(Any, body))), contains="quota")


# --- defects 2, 3, 9: steering and the pending-pod index ---------------------------------------------------


def _fat_pod(ns: str, name: str, *, gated: bool) -> dict[str, Any]:
    # Gated: steerable (a whole-GPU claim template of its own namespace); else an unbound claim pod.
    body = pod(ns, name, template="whole") if gated else pod(ns, name, claim_name="none")
    # Gated: so full that no write can add a key to the map (256 KiB of keys and values); else 250 KB.
    size = 262_144 - 64 if gated else BLOB
    body["metadata"]["annotations"] = {"tenant.example/blob": "x" * size}
    if gated:
        body["spec"]["schedulingGates"] = [{"name": STEER_GATE}]
    return body


def self_gated_flood(arena: Arena) -> str:
    a = arena.attacker
    a.must_create(whole_gpu_template(a.ns))
    for i in range(FLOOD):
        a.must_create(_fat_pod(a.ns, f"hog-{i:02d}", gated=True))
    time.sleep(3)  # a few steering passes over the flood
    touched = [
        p["metadata"]["name"]
        for p in arena.gc.pods(a.ns)
        if p["metadata"]["name"].startswith("hog-") and STEERED in (p["metadata"].get("annotations") or {})
    ]
    assert not touched, f"the controller steered {len(touched)} pods of a namespace nobody opted in: {touched[:3]}"
    evidence = steered_in_time(arena.gc, arena.serving, "late-1")
    return f"{FLOOD} self-gated pods with 256 KiB of annotations; {evidence}"


def forged_reservation(arena: Arena) -> str:
    a = arena.attacker
    gpus = sorted(
        f"{pool}/{device}"
        for pool, device in arena.gc.slice_devices()
        if device.startswith("gpu-") and device.removeprefix("gpu-").isdigit()
    )
    # One forged reservation per whole GPU: each one that is free would be held for the liar.
    for i, gpu in enumerate(gpus):
        body = pod(a.ns, f"liar-{i:02d}", claim_name="none")
        body["spec"]["nodeSelector"] = {"tenancy.e2e/nowhere": "true"}  # stays unbound
        node = gpu.split("/")[0]
        forged = decide.encode_placement(model.MemberPlacement(member=0, node=node, domain="", gpus=(gpu,)))
        body["metadata"]["annotations"] = {STEERED: forged}
        a.must_create(body)
    time.sleep(2)
    return f"{len(gpus)} pods each 'reserving' one GPU, every GPU; " + steered_in_time(
        arena.gc, arena.serving, "late-2"
    )


def oversized_flood(arena: Arena) -> str:
    a = arena.attacker
    before = controller_rss_kib(arena.gc)
    # Large enough that what a replica keeps per pod shows above the allocator's high-water marks: one flood of 40
    # such pods moved a replica's RSS by up to 6 MiB and four floods in a row by -2 to +9 MiB (decoding, then
    # trimmed), never by the flood's size (tests/unit/controller/steer/test_steer.py proves the index's bound).
    count = OVERSIZED
    for i in range(count):
        a.must_create(_fat_pod(a.ns, f"fat-{i:03d}", gated=False))
    time.sleep(8)  # the controllers' watches deliver them
    after = controller_rss_kib(arena.gc)
    assert set(after) == set(before) and after, f"controller replicas before {before}, after {after}"
    flood_kib = count * BLOB // 1024
    grew = {name: after[name] - before[name] for name in after}
    assert all(g < flood_kib // 2 for g in grew.values()), f"RSS grew {grew} KiB for a {flood_kib} KiB flood"
    return f"{count} unbound claim pods x 250 KB ({flood_kib} KiB): controller RSS change {grew} KiB, replicas up"


# --- defect 4: tiers ---------------------------------------------------------------------------------------


def gold_claim(arena: Arena) -> str:
    a = arena.attacker
    gold = claim(a.ns, "gold", "mps-gold.gpu.gpuplane.dev", share=60)
    template = {**gold, "kind": "ResourceClaimTemplate", "metadata": {"name": "gold-t"}, "spec": {"spec": gold["spec"]}}
    first = refused(a.create(gold), contains="gpuplane.dev/max-tier")
    refused(a.create(template), contains="gpuplane.dev/max-tier")
    return first


def gold_by_gpurequest(arena: Arena) -> str:
    a = arena.attacker
    body = {
        "apiVersion": f"{G}/{V}",
        "kind": "GpuRequest",
        "metadata": {"name": "sneak", "namespace": a.ns},
        "spec": {"memory": "8Gi", "compute": 20, "isolation": "soft", "tier": "gold"},
    }
    a.must_create(body)

    def status() -> dict[str, Any] | None:
        got = arena.gc.kubectl_json("get", "gpurequest", "-n", a.ns, "sneak")
        return got.get("status") or None

    st = eventually(status, 60, "the GpuRequest's status")
    templates = arena.gc.kubectl_json("get", "resourceclaimtemplates", "-n", a.ns)["items"]
    gold = [t["metadata"]["name"] for t in templates if "gold" in str(t["spec"])]
    assert not gold, f"the controller wrote a gold template for an ungranted namespace: {gold}"
    return f"status {st.get('phase')}: {str(st.get('message') or st.get('reason'))[:140]}; no gold template"


def forged_decision(arena: Arena) -> str:
    a = arena.attacker
    victim = f"{arena.serving.ns}/share"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    note = {"metadata": {"annotations": {"gpuplane.dev/noisy-neighbour-decision": f"refused@{stamp}; move {victim}"}}}
    status, message = outcome(
        lambda: a.custom.patch_namespaced_custom_object("resource.k8s.io", "v1", a.ns, "resourceclaims", "mine", note)
    )
    assert status == 0, f"the attacker cannot annotate its own claim ({status} {message}): nothing tried"
    # Display only (tests/unit/controller/rebalance/test_rebalance_tenancy.py drives the alert); here: nothing of
    # the victims moves.
    return "own claim annotated 'refused@...; move <victim>'; the invariants check the victims stay"


ATTACKS: list[Attack] = [
    Attack(
        "gang-spec-priority",
        "1",
        "GpuGang named like the victim's, spec.priority 1000000, its claims squatted",
        "victim's gang keeps running; attacker Queued",
        gang_spec_priority,
    ),
    Attack(
        "priority-class-not-granted",
        "1",
        f"pod of PriorityClass {HIGH}, never granted to the namespace",
        "refused by the quota admission",
        priority_class_not_granted,
    ),
    Attack(
        "grant-itself",
        "+",
        "own PriorityClass, own ResourceQuota, tier/steering labels on its namespace",
        "refused (RBAC)",
        grant_itself,
    ),
    Attack(
        "forged-reservation",
        "3",
        "unbound pods whose steered annotation reserves every GPU of every node",
        "victim's new pod steered and running before the steering timeout",
        forged_reservation,
    ),
    Attack(
        "self-gated-flood",
        "2",
        f"{FLOOD} pods carrying the steer gate with 256 KiB of annotations",
        "victim's new pod steered and running before the steering timeout",
        self_gated_flood,
    ),
    Attack(
        "oversized-flood",
        "9",
        f"{OVERSIZED} unbound claim pods with 250 KB annotations",
        "controller replicas up, RSS growth under half the flood",
        oversized_flood,
    ),
    Attack(
        "held-mig-flood",
        "+",
        f"{PODS} pods with 7g MIG claims, held by the tenant's own scheduling gate",
        "the MIG offer does not grow; no claim told",
        held_mig_flood,
    ),
    Attack(
        "unplaceable-mig-flood",
        "+",
        f"{PODS} pods with 7g MIG claims and a CPU request no node has",
        f"room on at most {PER_NAMESPACE} offered GPUs; the rest told of the namespace's bound",
        unplaceable_mig_flood,
    ),
    Attack(
        "gold-claim",
        "4",
        "mps-gold claim and claim template in a namespace never granted gold",
        "refused by gpuplane-tier-entitlement",
        gold_claim,
    ),
    Attack(
        "gold-by-gpurequest",
        "+",
        "GpuRequest tier gold, so the controller writes the gold template",
        "no gold template",
        gold_by_gpurequest,
    ),
    Attack(
        "forged-decision",
        "4",
        "own claim's noisy-neighbour decision annotation forged to name a victim",
        "nothing of the victims moves",
        forged_decision,
    ),
    Attack("node-slice", "5", "a ResourceSlice of gpuplane's driver for a node", "refused (RBAC)", node_slice),
    Attack(
        "controller-writes",
        "6",
        "DeviceTaintRule, evictions, template and pod label in the victim's namespace, ImexDomains and their status",
        "refused (RBAC)",
        controller_writes,
    ),
    Attack(
        "status-writes",
        "+",
        "gpugangs/status of its own and the victim's gang, the victim's gang spec",
        "refused (RBAC)",
        status_writes,
    ),
    Attack(
        "read-others",
        "+",
        "list the victims' pods, claims, gangs; gpuplane-system; all claims",
        "refused (RBAC)",
        read_others,
    ),
    Attack("scrape-metrics", "8", "get /metrics of the driver and the controller", "denied", scrape_metrics),
    Attack(
        "imex-group-squat",
        "+",
        "claims labelled gpuplane.dev/imex-group with the victim's gang's name, on two nodes",
        "victim's IMEX domain entry unchanged; attacker told ImexGroupRefused, no entry",
        group_squat,
    ),
    Attack(
        "imex-group-flood",
        "+",
        "five more IMEX groups across two nodes (six in all)",
        f"groups past {GROUPS_PER_NAMESPACE} per namespace told ImexGroupRefused; victim's entry unchanged",
        group_flood,
    ),
    Attack(
        "imex-group-bad-names",
        "+",
        "imex-group labels that are not DNS labels ('Not_A_Name', 'a.b.c'), one of 64 characters",
        "ImexGroupInvalid on the claims (the API server refuses 64); no entry",
        group_bad_names,
    ),
]
