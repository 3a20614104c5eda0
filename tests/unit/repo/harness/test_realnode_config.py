"""The pure parts of e2e.cluster.realnode: OCI layout archives, names and subnets, configs, mount and cgroup parsing."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from e2e.cluster.realnode import containerd, host, images, kubeletconf, mounts, network, oci
from e2e.plane import plan_files
from e2e.plane.realnode import plan


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}  # type: ignore[union-attr]


def test_oci_archive_is_a_valid_reproducible_layout(tmp_path: Path) -> None:
    entries = [oci.FileEntry("bin/tool", data=b"\x7fELF fake", mode=0o755), oci.FileEntry("bin/sh", link="/bin/tool")]
    first = oci.write_image(tmp_path / "a.tar", "example.com/x/tool:1.2", entries, oci.ImageConfig(cmd=("sh",)))
    second = oci.write_image(tmp_path / "b.tar", "example.com/x/tool:1.2", entries, oci.ImageConfig(cmd=("sh",)))
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    files = _members(tmp_path / "a.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"][oci.IMAGE_NAME_ANNOTATION] == "example.com/x/tool:1.2"
    assert entry["annotations"][oci.REF_NAME_ANNOTATION] == "1.2"
    # Every descriptor's digest and size match its blob.
    manifest_blob = files[f"blobs/sha256/{entry['digest'].split(':')[1]}"]
    assert hashlib.sha256(manifest_blob).hexdigest() == entry["digest"].split(":")[1]
    assert len(manifest_blob) == entry["size"]
    manifest = json.loads(manifest_blob)
    for descriptor in (manifest["config"], *manifest["layers"]):
        blob = files[f"blobs/sha256/{descriptor['digest'].split(':')[1]}"]
        assert len(blob) == descriptor["size"]
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Cmd"] == ["sh"]
    # The diff id is the digest of the uncompressed layer, which holds the parents, the file and the link.
    import gzip

    layer = gzip.decompress(files[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        by_name = {m.name: m for m in tar.getmembers()}
    assert by_name["bin"].isdir() and by_name["bin/tool"].mode == 0o755
    assert by_name["bin/sh"].issym() and by_name["bin/sh"].linkname == "/bin/tool"


def test_layer_refuses_paths_that_escape() -> None:
    with pytest.raises(ValueError, match="bad path"):
        oci.layer_tar([oci.FileEntry("../etc/passwd", data=b"")])


def test_static_elf_check(tmp_path: Path) -> None:
    assert not images.is_static_elf(Path("/bin/ls"))  # dynamically linked everywhere
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert not images.is_static_elf(tmp_path / "text")
    if Path("/bin/busybox").is_file() and b"/lib64/ld-linux" not in Path("/bin/busybox").read_bytes()[:4096]:
        assert images.is_static_elf(Path("/bin/busybox"))


def test_subnets_skip_what_the_machine_uses() -> None:
    used = [ipaddress.IPv4Network("10.200.0.0/16"), ipaddress.IPv4Network("10.201.0.0/24")]
    first = network.pick_subnet(0, used)
    assert first == ipaddress.IPv4Network("10.201.1.0/24")
    second = network.pick_subnet(0, used, [first])
    assert second == ipaddress.IPv4Network("10.201.2.0/24")
    assert network.gateway(first) == ipaddress.IPv4Address("10.201.1.1")
    # Different seeds (clusters) start at different places.
    assert network.pick_subnet(1234, []) != network.pick_subnet(4321, [])


def test_iptables_rule_matching_names_only_this_node() -> None:
    subnet = ipaddress.IPv4Network("10.230.5.0/24")
    mine = [
        '-A CNI-HOSTPORT-DNAT -m comment --comment "dnat name: \\"gpuplane-abc123-r0\\" id: \\"x\\"" -j CNI-DN-1',
        "-A CNI-DN-1 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.230.5.7:80",
        "-A FORWARD -i gpabc123r0 -j ACCEPT",
    ]
    others = ["-A FORWARD -i gpabc123r10 -j ACCEPT", "-A X -d 110.230.5.7/32 -j ACCEPT", "-A X -s 10.230.50.1 -j A"]
    markers = ["gpabc123r0", "gpuplane-abc123-r0"]
    assert all(network.rule_mentions(line, markers, [subnet]) for line in mine)
    assert not any(network.rule_mentions(line, markers, [subnet]) for line in others)


def test_conflist_keeps_everything_on_the_nodes_bridge(tmp_path: Path) -> None:
    conf = network.conflist("gpuplane-abc123-r0", "gpabc123r0", ipaddress.IPv4Network("10.230.5.0/24"), tmp_path)
    bridge, portmap = conf["plugins"]
    assert bridge["bridge"] == "gpabc123r0" and bridge["ipMasq"] is False and bridge["isGateway"] is True
    assert bridge["ipam"]["dataDir"] == str(tmp_path)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.230.5.0/24", "gateway": "10.230.5.1"}]]
    assert portmap["type"] == "portmap"


def _node(state: Path, index: int = 0) -> plan.RealNode:
    return plan.RealNode(
        name=f"hgx-h100-real-{index}",
        profile="hgx-h100",
        index=index,
        tag=plan.cluster_tag(state),
        node_dir=state / "realnodes" / f"hgx-h100-real-{index}",
        base_dir=plan.base_root(state) / str(index),
        subnet="10.230.5.0/24",
        kubelet_port=10250,
        healthz_port=10248,
        metrics_port=9000,
    )


def test_names_are_unique_per_cluster_and_fit_the_kernel(tmp_path: Path) -> None:
    a, b = _node(tmp_path / "one", 12), _node(tmp_path / "two", 12)
    assert a.bridge != b.bridge and a.cgroup_root != b.cgroup_root and a.network != b.network
    assert len(a.bridge) <= 15  # IFNAMSIZ - 1
    long_state = tmp_path / ("x" * 120)
    node = _node(long_state, 99)
    assert str(node.base_dir).startswith("/tmp/gprn-")
    longest = node.mps_root / ("0" * 36) / "pipe" / "control"
    assert len(str(longest)) <= plan_files.MAX_SOCKET_PATH
    assert plan.RealNode.from_json(json.loads(json.dumps(node.to_json()))) == node
    assert plan.node_names("hgx-h100", 2, ["hgx-h100-real-0"]) == ["hgx-h100-real-1", "hgx-h100-real-2"]


def test_containerd_config_is_toml_with_the_nodes_own_paths(tmp_path: Path) -> None:
    paths = containerd.ContainerdPaths(
        root=tmp_path / "c",
        state=tmp_path / "s",
        socket=tmp_path / "containerd.sock",
        cni_conf_dir=tmp_path / "cni",
        cdi_dir=tmp_path / "cdi",
        opt_dir=tmp_path / "c" / "opt",
    )
    doc = tomllib.loads(containerd.config(paths, Path("/usr/sbin/runc"), Path("/usr/lib/cni")))
    assert doc["version"] == 4 and doc["imports"] == []
    plugins = doc["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "cdi")]
    assert runtime["netns_mounts_under_state_dir"] is True
    options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert options == {"BinaryName": "/usr/sbin/runc", "Root": str(tmp_path / "s" / "runc"), "SystemdCgroup": False}
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10"
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True
    assert plugins["io.containerd.shim.v1.manager"]["socket_dir"] == str(tmp_path / "s" / "s")
    # Nothing of the machine's own containerd: every path is the node's, or runc's and the CNI plugins'.

    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    absolute = [s for s in strings(doc) if s.startswith("/")]
    assert absolute and all(s.startswith(str(tmp_path)) or s in ("/usr/sbin/runc", "/usr/lib/cni") for s in absolute)


def test_kubelet_configuration(tmp_path: Path) -> None:
    settings = kubeletconf.KubeletSettings(
        node_name="n",
        node_ip="10.230.5.1",
        root_dir=tmp_path / "k",
        kubeconfig=tmp_path / "kc",
        client_ca=tmp_path / "ca.crt",
        runtime_socket=tmp_path / "containerd.sock",
        cgroup_root="/gpuplane-abc123-r0",
        port=40001,
        healthz_port=40002,
        feature_gates={"ResourceHealthStatus": True},
        labels={"b": "2", "a": "1"},
    )
    path = kubeletconf.write_configuration(tmp_path / "kubelet.yaml", settings)
    doc = yaml.safe_load(path.read_text())
    assert doc["failCgroupV1"] is False and doc["cgroupDriver"] == "cgroupfs"
    assert doc["makeIPTablesUtilChains"] is False and doc["readOnlyPort"] == 0
    assert doc["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'containerd.sock'}"
    assert doc["featureGates"] == {"ResourceHealthStatus": True}
    assert doc["podLogsDir"].startswith(str(tmp_path / "k"))
    argv = kubeletconf.argv(Path("/bin/kubelet"), path, settings)
    assert "--node-labels=a=1,b=2" in argv and "--node-ip=10.230.5.1" in argv
    assert f"--cert-dir={tmp_path / 'k' / 'pki'}" in argv


MOUNTINFO = """\
22 1 0:21 / /sys/fs/cgroup rw - tmpfs tmpfs rw
23 22 0:22 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
24 22 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
25 22 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
26 22 0:25 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
30 1 0:30 / /tmp/gprn-1/0/k rw shared:1 - ext4 /dev/vda rw
31 30 0:31 / /tmp/gprn-1/0/k/pods/x/volumes/kube-api-access rw - tmpfs tmpfs rw
32 1 0:32 / /tmp/gprn-1/0/s/netns/cni\\040a rw - nsfs nsfs rw
33 1 0:33 / /tmp/gprn-10/0 rw - tmpfs tmpfs rw
"""


def test_mountinfo_parsing(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    layout = host.cgroup_layout(info)
    assert layout.v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "name=systemd": Path("/sys/fs/cgroup/systemd"),
    }
    assert layout.unified == Path("/sys/fs/cgroup/unified") and not layout.is_v2
    found = mounts.mounts_under(Path("/tmp/gprn-1/0"), info)
    assert found == [
        Path("/tmp/gprn-1/0/k/pods/x/volumes/kube-api-access"),
        Path("/tmp/gprn-1/0/s/netns/cni a"),
        Path("/tmp/gprn-1/0/k"),
    ]
