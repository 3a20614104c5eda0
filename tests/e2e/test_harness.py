"""Fast checks of the harness's parts that need no control plane (not marked e2e: they always run)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from e2e.cluster import build, controlplane, flags, pki, procs, releases
from e2e.plane import nodes


def test_version_key_comes_from_the_pinned_go_mod() -> None:
    pins = build.read_pins(build.MODULE_DIR / "go.mod")
    assert pins.version_key == f"{pins.kubernetes}-etcd{pins.etcd.removeprefix('v')}-r{build.RECIPE_REVISION}"
    assert pins.kubernetes.startswith("v1.") and pins.etcd.startswith("v3.")


def test_version_key_follows_a_changed_pin(tmp_path: Path) -> None:
    go_mod = tmp_path / "go.mod"
    go_mod.write_text(
        "module x\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/kubernetes v1.37.0\n\tgo.etcd.io/etcd/server/v3 v3.6.9\n)\n"
    )
    assert build.read_pins(go_mod).version_key == f"v1.37.0-etcd3.6.9-r{build.RECIPE_REVISION}"


def test_kubernetes_binaries_are_stamped_with_the_pinned_release_and_etcd_is_not() -> None:
    pins = build.ModulePins(kubernetes="v1.36.3", etcd="v3.6.8", go="1.26.0")
    flags = build.ldflags("k8s.io/kubernetes/cmd/kube-apiserver", pins).split()
    assert flags[:2] == ["-s", "-w"]
    stamps = {flags[i + 1] for i, flag in enumerate(flags) if flag == "-X"}
    assert {
        "k8s.io/component-base/version.gitVersion=v1.36.3",
        "k8s.io/component-base/version.gitMajor=1",
        "k8s.io/component-base/version.gitMinor=36",
    } <= stamps
    assert build.ldflags(build.ETCD_MODULE, pins) == "-s -w"


@pytest.mark.parametrize(
    ("output", "parsed"),
    [
        ("go version go1.26.8 linux/amd64", (1, 26)),
        ("go version go1.9 linux/amd64", (1, 9)),
        ("nonsense", None),
    ],
)
def test_parse_go_version(output: str, parsed: tuple[int, int] | None) -> None:
    assert build.parse_go_version(output) == parsed


def _fake_go(directory: Path, version: str = "go1.26.8", fail: str = "") -> Path:
    script = directory / "go"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            if [ "$1" = version ]; then echo "go version {version} linux/amd64"; exit 0; fi
            out=""; prev=""; pkg=""
            for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; pkg="$a"; done
            case "$pkg" in *{fail or "NEVER"}*) echo "compile error in $pkg" >&2; exit 2;; esac
            echo "#!/bin/sh" > "$out"; echo "built with GOFLAGS=$GOFLAGS" >> "$out"
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def test_missing_go_is_reported_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match=r"`go` was not found on PATH.*Go >= 1\.26"):
        build.check_go({"PATH": str(tmp_path)})


def test_old_go_is_reported(tmp_path: Path) -> None:
    _fake_go(tmp_path, version="go1.24.1")
    with pytest.raises(build.BuildError, match=r"go1\.24\.1.*needs Go >= 1\.26"):
        build.check_go({"PATH": str(tmp_path)})


def test_ensure_binaries_builds_only_what_is_missing_and_renames_into_place(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    bindir = _fake_go(tmp_path / "bin")
    cache = tmp_path / "cache"
    existing = build.bin_paths("vtest", cache).etcd
    existing.parent.mkdir(parents=True)
    existing.write_text("#!/bin/sh\n# cached\n")
    existing.chmod(0o755)
    lines: list[str] = []
    bins = build.ensure_binaries("vtest", root=cache, environ={"PATH": str(bindir)}, out=lines.append)
    assert bins.missing() == []
    assert existing.read_text() == "#!/bin/sh\n# cached\n"
    assert "GOFLAGS=-mod=mod" in bins.kube_apiserver.read_text()
    assert not list(bins.directory.glob(".*.tmp-*"))
    assert any(line.startswith("built kube-apiserver in") for line in lines)
    assert not any("etcd" in line and line.startswith("building") for line in lines)
    assert lines[-1].startswith("built 4 binaries in")


def test_a_failed_build_caches_nothing_and_shows_the_output(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    bindir = _fake_go(tmp_path / "bin", fail="kube-scheduler")
    with pytest.raises(build.BuildError, match=r"compile error in k8s.io/kubernetes/cmd/kube-scheduler"):
        build.ensure_binaries("vtest", root=tmp_path / "cache", environ={"PATH": str(bindir)}, out=lambda _: None)
    bins = build.bin_paths("vtest", tmp_path / "cache")
    assert not bins.kube_scheduler.exists()
    assert not list(bins.directory.glob(".*.tmp-*"))


def test_cluster_pki_chains_to_the_ca_with_the_right_identities(tmp_path: Path) -> None:
    cluster = pki.generate_cluster_pki(tmp_path)
    ca = x509.load_pem_x509_certificate(cluster.ca.cert.read_bytes())

    def load(pair: pki.CertPair) -> x509.Certificate:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        cert.verify_directly_issued_by(ca)
        assert oct(pair.key.stat().st_mode & 0o777) == "0o600"
        return cert

    server = load(cluster.apiserver)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "kubernetes.default.svc"} <= set(sans.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku

    admin = load(cluster.admin)
    assert admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert load(cluster.scheduler).subject.rfc4514_string() == "CN=system:kube-scheduler"
    assert load(cluster.controller_manager).subject.rfc4514_string() == "CN=system:kube-controller-manager"

    node = pki.mint_node_cert(tmp_path, "gpu-node-1")
    assert load(node).subject.rfc4514_string() == "CN=system:node:gpu-node-1,O=system:nodes"
    assert "PRIVATE KEY" in cluster.service_account_key.read_text()
    assert "PUBLIC KEY" in cluster.service_account_pub.read_text()
    assert isinstance(admin.public_key(), ec.EllipticCurvePublicKey)


def test_kubeconfig_is_self_contained(tmp_path: Path) -> None:
    cluster = pki.generate_cluster_pki(tmp_path)
    path = pki.write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", cluster.ca.cert, cluster.admin, "admin")
    config = yaml.safe_load(path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1"
    assert config["users"][0]["user"]["client-key-data"]
    assert config["current-context"] == config["contexts"][0]["name"]


def test_node_spec_parsing() -> None:
    assert nodes.parse_node_spec("hgx-h100:2, gb200-nvl72:4,l4") == (
        nodes.NodeGroup("hgx-h100", 2), nodes.NodeGroup("gb200-nvl72", 4), nodes.NodeGroup("l4", 1),
    )  # fmt: skip
    assert nodes.parse_node_spec("") == ()
    for bad in ("x:0", "x:two", ":3"):
        with pytest.raises(ValueError, match="bad node spec"):
            nodes.parse_node_spec(bad)


def test_feature_gates_and_runtime_config_format() -> None:
    assert flags.format_gates({"B": False, "A": True}) == "A=true,B=false"
    assert flags.DEFAULT_RUNTIME_CONFIG[releases.RUNNING.workload_api] is True
    assert releases.RUNNING.feature_gates == flags.DEFAULT_FEATURE_GATES


def test_every_release_has_its_own_pinned_module_and_one_is_the_default() -> None:
    assert releases.DEFAULT in releases.RELEASES
    for minor, release in {**releases.RELEASES, **releases.PROBES}.items():
        pins = build.read_pins(release.module_dir / "go.mod")
        assert pins.kubernetes.startswith(f"v{minor}."), (minor, pins)
        assert release.runtime_config[release.workload_api] is True
    assert releases.get("v1.36.3") is releases.V1_36 and releases.get("1.37") is releases.V1_37
    assert releases.selected({}) is releases.get(releases.DEFAULT)
    assert releases.selected({releases.ENV: "1.36"}) is releases.V1_36
    assert releases.get("1.38.0-beta.0") is releases.V1_38_PROBE and "1.38" not in releases.RELEASES
    with pytest.raises(releases.UnknownRelease, match=r"may name one of 1\.36, 1\.37 \(default 1\.37\)"):
        releases.selected({releases.ENV: "1.35"})


def test_stop_from_a_pidfile_kills_the_whole_group_even_if_it_ignores_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "stubborn"
    script.write_text("#!/bin/sh\ntrap '' TERM\nsleep 300 &\nwait\n")
    script.chmod(0o755)
    proc, record = procs.spawn("stubborn", [str(script)], log=tmp_path / "log", pid_dir=tmp_path / "pids")
    try:
        time.sleep(0.3)
        again = procs.read_records(tmp_path / "pids")["stubborn"]
        assert again == record and procs.is_alive(again)
        children = subprocess.run(
            ["pgrep", "-g", str(record.pid)], check=False, capture_output=True, text=True
        ).stdout.split()
        assert len(children) >= 2
        started = time.monotonic()
        procs.stop(again, term_grace=0.5)  # as `down` does: no Popen handle
        assert time.monotonic() - started < 5
        assert not procs.is_alive(again)
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_missing_binary_is_reported_before_anything_starts(tmp_path: Path) -> None:
    bins = build.BinPaths.in_directory(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="python -m e2e build"):
        controlplane.ControlPlane(tmp_path / "state", bins, out=lambda _: None).start()
    assert not (tmp_path / "state" / "pids").exists() or not list((tmp_path / "state" / "pids").iterdir())


def test_die_with_parent_kills_the_component_when_its_starter_is_killed(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""\
            import sys, time
            from pathlib import Path
            from e2e.cluster import procs
            proc, record = procs.spawn("sleeper", ["/bin/sleep", "300"], log=Path({str(tmp_path / "log")!r}),
                                       pid_dir=Path({str(tmp_path / "pids")!r}), die_with_parent=True)
            print(proc.pid, flush=True)
            time.sleep(300)
            """)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        record = procs.read_records(tmp_path / "pids")["sleeper"]
        assert record.pid == pid and procs.is_alive(record)
        starter.kill()
        starter.wait()
        deadline = time.monotonic() + 5
        while procs.is_alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.is_alive(record)
    finally:
        starter.kill()
        starter.wait()
        procs.stop(procs.read_records(tmp_path / "pids")["sleeper"], term_grace=0.1)
