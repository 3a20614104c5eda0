"""The local overlay's install on real nodes: per-node names, the root substituted, the generated kustomization."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.plane import realinstall

OVERLAY_ARGS = [
    "--sim-config=/var/lib/gpuplane-local/$(NODE_NAME)/sim.yaml",
    "--registry-dir=/var/lib/gpuplane-local/$(NODE_NAME)/kubelet/plugins_registry",
]


@dataclasses.dataclass(frozen=True)
class FakeNode:
    name: str
    profile: str
    node_dir: Path
    kubelet_root: Path
    bridge: str = "gp000000r0"
    sim_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / "gpu.gpuplane.dev"

    @property
    def sim_state_dir(self) -> Path:
        return self.node_dir / "sim"


def _nodes(tmp_path: Path) -> list[FakeNode]:
    return [
        FakeNode(
            "hgx-h100-real-0", "hgx-h100", tmp_path / "realnodes" / "hgx-h100-real-0", tmp_path / "rn" / "0" / "k"
        ),
        FakeNode(
            "gb200-nvl72-real-0",
            "gb200-nvl72",
            tmp_path / "realnodes" / "gb200-nvl72-real-0",
            tmp_path / "rn" / "1" / "k",
            sim_config={"cluster_uuid": "u", "clique_id": 1},
        ),
    ]


def test_prepare_node_links_what_the_overlay_names(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path)
    for node in nodes:
        realinstall.prepare_node(node)
        realinstall.prepare_node(node)  # idempotent
    h100, gb200 = nodes
    # The driver's --registry-dir through the overlay's name resolves into the kubelet root (short paths).
    assert (
        h100.node_dir / "kubelet" / "plugins_registry"
    ).resolve() == h100.kubelet_root.resolve() / "plugins_registry"
    assert (h100.plugin_dir / "sim").resolve() == h100.sim_state_dir.resolve()
    assert yaml.safe_load((h100.node_dir / "sim.yaml").read_text()) == {"profile": "hgx-h100"}
    assert yaml.safe_load((gb200.node_dir / "sim.yaml").read_text()) == {
        "profile": "gb200-nvl72",
        "cluster_uuid": "u",
        "clique_id": 1,
    }
    layout = realinstall.layout_of(nodes)
    assert layout == realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")


def test_a_directory_where_a_link_belongs_is_refused(tmp_path: Path) -> None:
    node = _nodes(tmp_path)[0]
    (node.node_dir / "kubelet").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="is not a link"):
        realinstall.prepare_node(node)


def test_nodes_of_two_clusters_have_no_layout(tmp_path: Path) -> None:
    a = _nodes(tmp_path)[0]
    b = FakeNode("x", "hgx-h100", tmp_path / "other" / "x", tmp_path / "rn2" / "0" / "k")
    with pytest.raises(ValueError, match="more than one cluster"):
        realinstall.layout_of([a, b])


def test_root_substituted_everywhere(tmp_path: Path) -> None:
    layout = realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")
    rendered = yaml.safe_dump({"args": OVERLAY_ARGS, "hostPath": {"path": "/var/lib/gpuplane-local"}})
    out = realinstall.substitute_root(rendered, layout)
    assert realinstall.LOCAL_ROOT not in out
    assert f"{tmp_path}/realnodes/$(NODE_NAME)/sim.yaml" in out
    with pytest.raises(ValueError, match="names no"):
        realinstall.substitute_root("kind: Namespace\n", layout)


def test_kustomization_pins_images_and_mounts_the_runtime_root(tmp_path: Path) -> None:
    layout = realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")
    k = realinstall.kustomization(
        layout,
        {
            "localhost/gpuplane-driver": "localhost/gpuplane-driver:0.1.0-abc",
            "localhost/gpuplane-controller": "localhost/gpuplane-controller:0.1.0-def",
        },
    )
    assert k["resources"] == ["rendered.yaml"]
    assert k["images"] == [
        {"name": "localhost/gpuplane-controller", "newName": "localhost/gpuplane-controller", "newTag": "0.1.0-def"},
        {"name": "localhost/gpuplane-driver", "newName": "localhost/gpuplane-driver", "newTag": "0.1.0-abc"},
    ]
    (patch,) = k["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "gpuplane-driver"}
    ops = yaml.safe_load(patch["patch"])
    assert {o["value"]["name"] for o in ops} == {"real-node-runtime"}
    assert ops[0]["value"]["hostPath"]["path"] == ops[1]["value"]["mountPath"] == str(tmp_path / "rn")
    with pytest.raises(ValueError, match="has no tag"):
        realinstall.kustomization(layout, {"x": "localhost/x"})


def test_kustomization_sets_the_controllers_replicas_only_when_asked(tmp_path: Path) -> None:
    layout = realinstall.Layout(tmp_path / "realnodes", tmp_path / "rn")
    images = {"localhost/gpuplane-driver": "localhost/gpuplane-driver:0.1.0-abc"}
    assert "replicas" not in realinstall.kustomization(layout, images)
    assert realinstall.kustomization(layout, images, replicas=3)["replicas"] == [
        {"name": "gpuplane-controller", "count": 3}
    ]
    assert realinstall.kustomization(layout, images, replicas=0)["replicas"] == [
        {"name": "gpuplane-controller", "count": 0}
    ]
    with pytest.raises(ValueError, match="0 or more"):
        realinstall.kustomization(layout, images, replicas=-1)


def test_api_rule_names_the_bridge() -> None:
    rule = realinstall.api_rule("gpabcdefr0", 6443)
    assert rule[:3] == ["PREROUTING", "-i", "gpabcdefr0"]
    assert rule[-2:] == ["--to-destination", "127.0.0.1:6443"]
    assert "10.0.0.1/32" in rule


def test_the_install_record_is_what_up_status_and_down_read_back(tmp_path: Path) -> None:
    from e2e.plane import podinstall

    assert podinstall.recorded(tmp_path) is None  # nothing recorded: host processes
    install = podinstall.PodInstall(
        admin=lambda *a, **k: "", kubeconfig=tmp_path / "kubeconfig", state_dir=tmp_path, nodes=[], replicas=2
    )
    install.installed = "N"
    install.save_record()
    record = podinstall.recorded(tmp_path)
    assert record == {
        "installed": "N",
        "kustomization": str(tmp_path / "install" / "N"),
        "images": [],
        "real_nodes": [],
        "replicas": 2,
    }
    podinstall.forget(tmp_path)
    assert podinstall.recorded(tmp_path) is None
    podinstall.forget(tmp_path)  # twice is fine (down after down)


def test_the_apiserver_port_comes_from_the_kubeconfig(tmp_path: Path) -> None:
    from e2e.plane import podinstall

    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({"clusters": [{"cluster": {"server": "https://127.0.0.1:52709"}}]}))
    assert podinstall.apiserver_port(config) == 52709
    config.write_text(yaml.safe_dump({"clusters": [{"cluster": {"server": "https://127.0.0.1"}}]}))
    with pytest.raises(ValueError, match="names no port"):
        podinstall.apiserver_port(config)
