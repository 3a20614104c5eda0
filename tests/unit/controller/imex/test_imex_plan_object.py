"""The IMEX plan object: render -> parse -> claims_on, hostile input refused whole, CRD bounds, RBAC."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplane.api import imex, names
from gpuplane.controller.imex import objects
from gpuplane.controller.imex.decide import PlacedGang, plan

REPO = Path(__file__).resolve().parents[4]
CLIQUES = {f"a{i}": "cluster-1.0" for i in range(18)}


def placed(uid: str, *nodes: str, since: float = 0.0) -> PlacedGang:
    return PlacedGang(uid=uid, key=f"team/{uid}", since=since, nodes=nodes, cliques=CLIQUES)


def members(uid: str, *nodes: str) -> objects.GangMembers:
    claims = tuple(imex.Claim("team", f"{uid}-{i}", f"{uid}-c{i}", node) for i, node in enumerate(nodes))
    return objects.GangMembers("team", uid, claims)


def two_gangs() -> tuple[dict[str, Any], ...]:
    """old on a0,a1; young on a1,a2: one domain (they share a1), two channels."""
    gangs = {"old": ("a0", "a1"), "young": ("a1", "a2")}
    p = plan([placed("old", *gangs["old"], since=1), placed("young", *gangs["young"], since=2)])
    rendered = objects.render(p, {uid: members(uid, *nodes) for uid, nodes in gangs.items()})
    assert rendered.refused == {}
    return rendered.objects


def parsed(obj: Any) -> imex.ImexDomain:
    model, why = imex.parse_domain(obj)
    assert why == "" and model is not None
    return model


def test_round_trip_render_parse_claims_on() -> None:
    (obj,) = two_gangs()
    assert obj["metadata"] == {"name": "imex-old", "namespace": "gpuplane-system", "labels": objects.MANAGED_BY}
    assert obj["apiVersion"] == "gpuplane.dev/v1alpha1" and obj["kind"] == "ImexDomain"
    domain = parsed(obj)
    assert domain.nodes == ("a0", "a1", "a2") and domain.clique == "cluster-1.0"
    assert [(g.uid, g.channel) for g in domain.gangs] == [("old", 1), ("young", 2)]
    assert imex.domain_to_spec(domain) == obj["spec"]
    on_a1 = imex.claims_on([domain], "a1")
    assert on_a1.refused == {}
    assert {uid: (c.domain, c.channel, c.nodes) for uid, c in on_a1.claims.items()} == {
        "old-c1": ("imex-old", 1, ("a0", "a1", "a2")),
        "young-c0": ("imex-old", 2, ("a0", "a1", "a2")),
    }
    assert on_a1.claims["old-c1"].peers == ("a0", "a2")
    assert set(imex.claims_on([domain], "a0").claims) == {"old-c0"}
    assert imex.claims_on([domain], "a9").claims == {}


def test_status_is_parsed() -> None:
    (obj,) = two_gangs()
    obj = copy.deepcopy(obj)
    obj["metadata"]["generation"] = 3
    obj["status"] = {
        "nodes": [
            {"node": "a0", "ready": True, "observedGeneration": 3},
            {"node": "a1", "ready": False, "message": "peer a2 not connected", "observedGeneration": 2},
        ]
    }
    domain = parsed(obj)
    assert domain.generation == 3
    assert domain.status == (
        imex.NodeStatus("a0", True, "", 3),
        imex.NodeStatus("a1", False, "peer a2 not connected", 2),
    )


def _set(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()
G0 = ("spec", "gangs", 0)
C0 = (*G0, "claims", 0)
HOSTILE: list[tuple[tuple[Any, ...], Any, str]] = [
    (("spec",), "x", "spec: must be an object, not str"),
    (("spec", "extra"), 1, "spec: unknown field(s) 'extra'"),
    (("spec", "clique"), _DELETE, "spec.clique: required"),
    (("spec", "clique"), 7, "spec.clique: must be a string, not int"),
    (("spec", "clique"), "c" * 65, "spec.clique: 65 characters, at most 64"),
    (("spec", "nodes"), ["a0"], "spec.nodes: 1 entries, must be 2..72"),
    (("spec", "nodes"), [f"n{i}" for i in range(73)], "spec.nodes: 73 entries, must be 2..72"),
    (("spec", "nodes"), ["a0", "a1", "a1"], "spec.nodes: 'a1' listed twice"),
    (("spec", "nodes"), ["a0", "a1", "n" * 254], "spec.nodes[2]: 254 characters, at most 253"),
    (("spec", "gangs"), [], "spec.gangs: 0 entries, must be 1..36"),
    ((*G0, "channel"), 0, "spec.gangs[0].channel: 0 is not in 1..2047"),
    ((*G0, "channel"), names.IMEX_CHANNEL_COUNT, "spec.gangs[0].channel: 2048 is not in 1..2047"),
    ((*G0, "channel"), True, "spec.gangs[0].channel: must be an integer, not bool"),
    ((*G0, "channel"), "1", "spec.gangs[0].channel: must be an integer, not str"),
    ((*G0, "channel"), 2, "spec.gangs[1].channel: 2 is also spec.gangs[0]'s channel"),
    ((*G0, "uid"), "young", "spec.gangs[1].uid: 'young' is also spec.gangs[0]'s"),
    ((*G0, "name"), "g" * 254, "spec.gangs[0].name: 254 characters, at most 253"),
    ((*G0, "namespace"), "", "spec.gangs[0].namespace: must not be empty"),
    ((*G0, "claims"), [], "spec.gangs[0].claims: 0 entries, must be 1..512"),
    ((*C0, "node"), "b7", "spec.gangs[0].claims[0].node: 'b7' is not one of the domain's nodes"),
    ((*C0, "namespace"), "other", "spec.gangs[0].claims[0].namespace: 'other' is not the gang's namespace 'team'"),
    ((*C0, "uid"), "young-c0", "spec.gangs[1].claims[0].uid: 'young-c0' is listed twice (also in spec.gangs[0])"),
    ((*C0, "uid"), "u" * 65, "spec.gangs[0].claims[0].uid: 65 characters, at most 64"),
    ((*C0, "port"), 1, "spec.gangs[0].claims[0]: unknown field(s) 'port'"),
    (("metadata", "name"), "x" * 64, "metadata.name: 64 characters, at most 63"),
    (("metadata", "generation"), -1, "metadata.generation: -1 is not in 0..9223372036854775807"),
    (("status",), {"nodes": [{"node": "a0", "ready": "yes"}]}, "status.nodes[0].ready: must be a boolean, not str"),
    (("status",), {"nodes": [{"node": "a0", "ready": True}] * 2}, "status.nodes[1].node: 'a0' reported twice"),
    (("status",), {"nodes": [{"node": "a0", "ready": True, "message": "m" * 1025}]}, "at most 1024"),
    (("status",), {"nodes": [{"node": "a0", "ready": True, "observedGeneration": 1.5}]}, "must be an integer"),
    (("status",), {"nodes": [{"node": "a0"}]}, "status.nodes[0].ready: required"),
]


@pytest.mark.parametrize(("path", "value", "message"), HOSTILE, ids=[m[:50] for _, _, m in HOSTILE])
def test_hostile_input_is_refused_whole(path: tuple[Any, ...], value: Any, message: str) -> None:
    (obj,) = two_gangs()
    model, why = imex.parse_domain(_set(obj, path, value))
    assert model is None
    assert why.startswith("ImexDomain ") and message in why, why


def test_too_many_gangs_and_claims_and_non_objects_are_refused() -> None:
    (obj,) = two_gangs()
    gang = obj["spec"]["gangs"][0]
    many = [dict(gang, uid=f"g{i}", channel=i + 1) for i in range(37)]
    assert "spec.gangs: 37 entries, must be 1..36" in imex.parse_domain(_set(obj, ("spec", "gangs"), many))[1]
    claims = [dict(gang["claims"][0], uid=f"c{i}") for i in range(513)]
    assert "513 entries, must be 1..512" in imex.parse_domain(_set(obj, (*G0, "claims"), claims))[1]
    assert imex.parse_domain([]) == (None, "ImexDomain (no name): object: must be an object, not list")
    assert imex.parse_domain({"metadata": {"name": "x"}})[1] == "ImexDomain 'x': object.spec: required"


def test_a_claim_in_two_domains_gets_neither() -> None:
    (obj,) = two_gangs()
    domain = parsed(obj)
    other = imex.ImexDomain(
        "imex-other",
        0,
        "cluster-1.0",
        ("a5", "a6"),
        (imex.Gang("team", "o", "o", 5, (imex.Claim("team", "old-0", "old-c0", "a5"),)),),
    )
    result = imex.claims_on([domain, other], "a0")
    assert result.claims == {}
    assert "listed by more than one IMEX domain (imex-old, imex-other)" in result.refused["old-c0"]
    assert "old-c0" not in imex.claims_on([domain, other], "a5").claims


def test_a_node_in_two_domains_gives_no_claim_a_channel() -> None:
    (obj,) = two_gangs()
    domain = parsed(obj)
    other = imex.ImexDomain(
        "imex-x",
        0,
        "cluster-1.0",
        ("a2", "a3"),
        (imex.Gang("team", "x", "x", 9, (imex.Claim("team", "x-0", "x-c0", "a2"),)),),
    )
    result = imex.claims_on([domain, other], "a2")
    assert result.claims == {}
    assert set(result.refused) == {"young-c1", "x-c0"}
    assert "node a2 is in more than one IMEX domain (imex-old, imex-x)" in result.refused["x-c0"]
    assert set(imex.claims_on([domain, other], "a0").claims) == {"old-c0"}  # a0 is in one domain only


def test_render_leaves_out_a_domain_without_members_or_past_the_bounds() -> None:
    p = plan([placed("g1", "a0", "a1"), placed("g2", "a2", "a3")])
    rendered = objects.render(p, {"g1": members("g1", "a0", "a1")})
    assert [o["metadata"]["name"] for o in rendered.objects] == ["imex-g1"]
    assert rendered.refused == {"imex-g2": "IMEX domain imex-g2: no member claims known for gang(s) g2"}
    bad = objects.GangMembers("team", "g2", (imex.Claim("elsewhere", "x", "x", "a2"),))
    rendered = objects.render(p, {"g1": members("g1", "a0", "a1"), "g2": bad})
    assert "is not the gang's namespace" in rendered.refused["imex-g2"]


def test_diff_creates_updates_and_deletes_by_name_on_the_spec_only() -> None:
    (obj,) = two_gangs()
    same = _set(obj, ("status",), {"nodes": [{"node": "a0", "ready": True}]})
    assert objects.diff([obj], [same]) == objects.Diff((), (), ())
    changed = _set(obj, (*G0, "channel"), 7)
    stale = _set(obj, ("metadata", "name"), "imex-gone")
    d = objects.diff([obj], [changed, stale])
    assert d.create == () and d.update == (obj,) and d.delete == ("imex-gone",)
    assert objects.diff([obj], []) == objects.Diff((obj,), (), ())


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "gpuplane.dev_imexdomains.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["scope"] == "Namespaced" and version["subresources"] == {"status": {}}
    return dict(version["schema"]["openAPIV3Schema"]["properties"])


def test_the_crd_schema_bounds_are_the_parsers() -> None:
    props = _schema()
    spec = props["spec"]["properties"]
    assert props["metadata"]["properties"]["name"]["maxLength"] == imex.MAX_OBJECT_NAME
    assert spec["clique"]["maxLength"] == imex.MAX_CLIQUE
    assert (spec["nodes"]["minItems"], spec["nodes"]["maxItems"]) == (imex.MIN_NODES, imex.MAX_NODES)
    assert spec["nodes"]["items"]["maxLength"] == imex.MAX_NODE_NAME
    assert spec["gangs"]["maxItems"] == imex.MAX_GANGS
    gang = spec["gangs"]["items"]
    assert set(gang["required"]) == set(gang["properties"]) == imex.GANG_FIELDS
    g = gang["properties"]
    assert (g["channel"]["minimum"], g["channel"]["maximum"]) == (imex.MIN_CHANNEL, imex.MAX_CHANNEL)
    assert imex.MAX_CHANNEL == names.IMEX_CHANNEL_COUNT - 1 and imex.MIN_CHANNEL == 1
    assert (g["namespace"]["maxLength"], g["name"]["maxLength"], g["uid"]["maxLength"]) == (
        imex.MAX_NAMESPACE,
        imex.MAX_NAME,
        imex.MAX_UID,
    )
    assert g["claims"]["maxItems"] == imex.MAX_CLAIMS
    claim = g["claims"]["items"]
    assert set(claim["required"]) == set(claim["properties"]) == imex.CLAIM_FIELDS
    c = claim["properties"]
    assert [c[k]["maxLength"] for k in ("namespace", "name", "uid", "node")] == [
        imex.MAX_NAMESPACE,
        imex.MAX_NAME,
        imex.MAX_UID,
        imex.MAX_NODE_NAME,
    ]
    assert set(props["spec"]["required"]) == imex.SPEC_REQUIRED and set(spec) == imex.SPEC_FIELDS
    address = spec["addresses"]
    assert address["maxItems"] == imex.MAX_NODES and address["x-kubernetes-list-map-keys"] == ["node"]
    assert set(address["items"]["required"]) == set(address["items"]["properties"]) == imex.ADDRESS_FIELDS
    a = address["items"]["properties"]
    assert (a["node"]["maxLength"], a["address"]["maxLength"]) == (imex.MAX_NODE_NAME, imex.MAX_ADDRESS)
    status = props["status"]["properties"]["nodes"]
    assert status["maxItems"] == imex.MAX_NODES and status["x-kubernetes-list-map-keys"] == ["node"]
    s = status["items"]["properties"]
    assert set(s) == imex.NODE_STATUS_FIELDS
    assert s["message"]["maxLength"] == imex.MAX_MESSAGE and s["node"]["maxLength"] == imex.MAX_NODE_NAME


def test_the_crd_copies_are_identical() -> None:
    canonical = (REPO / "crds" / "gpuplane.dev_imexdomains.yaml").read_bytes()
    assert (REPO / "manifests" / "crds" / "gpuplane.dev_imexdomains.yaml").read_bytes() == canonical
    assert (REPO / "charts" / "gpuplane" / "crds" / "gpuplane.dev_imexdomains.yaml").read_bytes() == canonical
    kust = yaml.safe_load((REPO / "manifests" / "crds" / "kustomization.yaml").read_text())
    assert "gpuplane.dev_imexdomains.yaml" in kust["resources"]


def _imex_rules(path: Path) -> dict[tuple[str, str, str], set[str]]:
    """(kind, namespace, resource) -> verbs, for every rule naming imexdomains in the file."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in doc.get("rules", []):
            for resource in rule.get("resources", []):
                if resource.startswith("imexdomains") or resource == "*":
                    assert rule["apiGroups"] == ["gpuplane.dev"]
                    key = (doc["kind"], doc["metadata"].get("namespace", ""), resource)
                    out.setdefault(key, set()).update(rule["verbs"])
    return out


def test_rbac_controller_writes_driver_reads_and_reports_tenants_get_nothing() -> None:
    manifests = REPO / "manifests"
    assert _imex_rules(manifests / "controller" / "rbac.yaml") == {
        ("Role", "gpuplane-system", "imexdomains"): {"get", "list", "watch", "create", "update", "patch", "delete"},
    }
    assert _imex_rules(manifests / "driver" / "rbac.yaml") == {
        ("Role", "gpuplane-system", "imexdomains"): {"get", "list", "watch"},
        ("Role", "gpuplane-system", "imexdomains/status"): {"patch"},
    }
    assert _imex_rules(manifests / "tenants" / "roles.yaml") == {}
    tenant_text = (manifests / "tenants" / "roles.yaml").read_text()
    assert "imex" not in tenant_text.lower()


def test_the_chart_grants_the_same_imex_rules() -> None:
    templates = REPO / "charts" / "gpuplane" / "templates"
    for name in ("controller-rbac.yaml", "driver-rbac.yaml"):
        text = (templates / name).read_text()
        manifest = (REPO / "manifests" / name.split("-")[0] / "rbac.yaml").read_text()
        chart_rules = _rule_blocks(text)
        assert chart_rules and chart_rules == _rule_blocks(manifest), name
    assert "imex" not in (templates / "tenant-roles.yaml").read_text().lower()


def _rule_blocks(text: str) -> list[str]:
    """The rule lines of the file's imex Roles, as text (the chart's templating is elsewhere in the file)."""
    blocks: list[str] = []
    for doc in text.split("\n---"):
        if "\nkind: Role\n" in "\n" + doc and "-imex\n" in doc:
            blocks.append(doc[doc.index("rules:") :].strip())
    return blocks
