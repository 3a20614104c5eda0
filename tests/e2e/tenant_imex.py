"""IMEX-group attacks of tests/e2e/tenant_attacks.py::ATTACKS (issue 35), and the victims' IMEX evidence.

A tenant asks for an IMEX domain without a gang by labelling its own claims ``gpuplane.dev/imex-group``
(``docs/imex.md``). The label is tenant input: the attacker names its group after the victim's gang, makes
more groups across nodes than a namespace may hold, and writes names that are not DNS labels. What must hold:
the victim's ``ImexDomain`` entry (domain, channel, its claims and nodes) is the same after each attack (the
test's invariants compare :func:`imex_entries` before and after), and the attacker is told why on its claims
(``ImexGroupRefused``, ``ImexGroupInvalid``) and gets no domain entry.

In the arena the victim's gang fills the GB200 clique, so the attacker's groups sit on the HGX nodes (no
multi-node NVLink): the controller refuses them (no clique, or past the namespace's cap) and the drivers prepare
them at once (they never wait for a domain on GPUs without a clique). The channel cap per clique and per
namespace with free clique GPUs is proven in ``tests/unit/controller/imex/test_imex_groups.py``.
"""

from __future__ import annotations

from gpuplane.api import imex_group
from tests.e2e.conftest import GpuCluster, eventually
from tests.e2e.tenantkit import Arena, Tenant, claim, pod
from tests.e2e.test_imex import domains

GROUPS_PER_NAMESPACE = 4  # gpuplane.controller.imex.groups.MAX_PER_NAMESPACE
FLOOD_GROUPS = 5  # with the squatted group: two past the cap


def imex_entries(gc: GpuCluster, ns: str) -> dict[str, tuple[str, int, tuple[tuple[str, str], ...]]]:
    """Each ``ImexDomain`` entry (gang or group) of namespace ``ns``: "imex <name>" -> (domain, channel, its
    (claim uid, node) pairs)."""
    out = {}
    for obj in domains(gc):
        for entry in (obj.get("spec") or {}).get("gangs") or []:
            if entry.get("namespace") == ns:
                claims = tuple(sorted((str(c.get("uid")), str(c.get("node"))) for c in entry.get("claims") or []))
                out[f"imex {entry.get('name')}"] = (obj["metadata"]["name"], int(entry.get("channel", 0)), claims)
    return out


def _hgx(arena: Arena) -> list[str]:
    nodes = sorted(n.name for n in arena.gc.of_profile("hgx-h100"))
    assert len(nodes) >= 2, f"two HGX nodes wanted for a group across nodes, have {nodes}"
    return nodes[:2]


def _group(tenant: Tenant, name: str, group: str, nodes: list[str]) -> list[str]:
    """One bronze MPS claim labelled ``group`` per node, and a pod pinned there using it; the claims' names."""
    names = []
    for i, node in enumerate(nodes):
        body = claim(tenant.ns, f"{name}-{i}", "mps-bronze.gpu.gpuplane.dev", share=20)
        body["metadata"]["labels"] = {imex_group.LABEL: group}
        tenant.must_create(body)
        user = pod(tenant.ns, f"{name}-{i}", claim_name=f"{name}-{i}")
        user["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        tenant.must_create(user)
        names.append(f"{name}-{i}")
    return names


def _told(gc: GpuCluster, ns: str, reason: str) -> dict[str, list[str]]:
    """Claim name -> the messages of its Events of ``reason`` in ``ns``."""
    said: dict[str, list[str]] = {}
    for e in gc.kubectl_json("get", "events", "-n", ns)["items"]:
        if e.get("reason") == reason and e["involvedObject"].get("kind") == "ResourceClaim":
            said.setdefault(str(e["involvedObject"].get("name")), []).append(str(e.get("message", "")))
    return said


def _told_all(gc: GpuCluster, ns: str, claims: list[str], reason: str, what: str) -> dict[str, list[str]]:
    """Once every one of ``claims`` has an Event of ``reason``: claim -> its messages."""
    return dict(eventually(lambda: (s := _told(gc, ns, reason)) and set(claims) <= set(s) and s, 90, what))


def _no_entry(arena: Arena) -> None:
    mine = imex_entries(arena.gc, arena.attacker.ns)
    assert not mine, f"the attacker's groups got IMEX domain entries: {mine}"


def group_squat(arena: Arena) -> str:
    a, victim = arena.attacker, arena.gangs
    theirs = imex_entries(arena.gc, victim.ns)
    assert "imex train" in theirs, f"the victim's gang has no ImexDomain entry to attack: {theirs}"
    claims = _group(a, "squat", "train", _hgx(arena))
    said = _told_all(arena.gc, a.ns, claims, "ImexGroupRefused", "ImexGroupRefused on the squatting claims")
    _no_entry(arena)
    domain, channel, _ = theirs["imex train"]
    return f"group 'train' on two HGX nodes: {said[claims[0]][0][:110]}; victim keeps {domain} channel {channel}"


def group_flood(arena: Arena) -> str:
    a = arena.attacker
    nodes = _hgx(arena)
    claims = [c for i in range(FLOOD_GROUPS) for c in _group(a, f"flood{i}", f"flood{i}", nodes)]
    _told_all(arena.gc, a.ns, claims, "ImexGroupRefused", "ImexGroupRefused on every flooding claim")
    cap = f"already has {GROUPS_PER_NAMESPACE} IMEX groups"
    # Six groups across nodes, the squatted one the oldest, the flood's in name order: the two youngest are past
    # the cap once all are allocated (before that, a younger one may have been told only of the clique).
    past = ["flood3-0", "flood3-1", "flood4-0", "flood4-1"]

    def capped() -> list[str] | None:
        got = sorted(c for c, ms in _told(arena.gc, a.ns, "ImexGroupRefused").items() if any(cap in m for m in ms))
        return got if got == past else None

    eventually(capped, 90, f"the cap's Event on exactly {past}")
    _no_entry(arena)
    return f"{FLOOD_GROUPS} more groups across two nodes: {len(past)} claims told past the cap ({GROUPS_PER_NAMESPACE})"


def group_bad_names(arena: Arena) -> str:
    a = arena.attacker
    names = {"bad-upper": "Not_A_Name", "bad-dots": "a.b.c"}
    for name, value in names.items():
        body = claim(a.ns, name, "mps-bronze.gpu.gpuplane.dev", share=20)
        body["metadata"]["labels"] = {imex_group.LABEL: value}
        a.must_create(body)
    too_long = claim(a.ns, "bad-long", "mps-bronze.gpu.gpuplane.dev", share=20)
    too_long["metadata"]["labels"] = {imex_group.LABEL: "x" * 64}
    status, message = a.create(too_long)
    assert status == 422, f"a 64-character label value was not refused by the API server: {status} {message[:120]}"
    said = _told_all(arena.gc, a.ns, list(names), "ImexGroupInvalid", "ImexGroupInvalid on the bad names")
    assert all(any("is not a DNS label" in m for m in said[n]) for n in names), said
    _no_entry(arena)
    return f"'Not_A_Name', 'a.b.c': {said['bad-upper'][0][:100]}; 64 characters: API server {status}"
