"""This node's IMEX daemon: the pure decisions (:mod:`gpuplane.driver.sharing.imex_daemons`), the addresses
the controller writes, and the runner (:mod:`gpuplane.driver.sharing.imex_runner`) driving the real stand-ins
(``tests/fakes/nvidia-imex``, ``nvidia-imex-ctl``) for two simulated trays on loopback: the domain becomes
ready through them, a node-file change is a reload (SIGUSR1, same pid), a crashed daemon is restarted with
backoff and reported, and a domain gone stops the daemon and removes its files.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gpuplane.api import imex
from gpuplane.controller import indexed
from gpuplane.controller.imex import objects
from gpuplane.controller.imex.decide import PlacedGang, plan
from gpuplane.driver.prepare import imex_claims
from gpuplane.driver.sharing import imex_daemons as decide
from gpuplane.driver.sharing import imex_runner

FAKES = Path(__file__).resolve().parents[3] / "fakes"
IMEX, CTL = FAKES / "nvidia-imex", FAKES / "nvidia-imex-ctl"
A, B = "127.0.0.51", "127.0.0.52"


def domain_obj(nodes: dict[str, str], generation: int = 1, name: str = "imex-g1") -> dict[str, Any]:
    """An ImexDomain as the API holds it: one gang with a claim on each of ``nodes`` (name -> address)."""
    names = sorted(nodes)
    return {
        "metadata": {"name": name, "generation": generation, "resourceVersion": "1"},
        "spec": {
            "clique": "c1",
            "nodes": names,
            "gangs": [
                {
                    "namespace": "t",
                    "name": "g1",
                    "uid": "g1",
                    "channel": 1,
                    "claims": [{"namespace": "t", "name": f"c-{n}", "uid": f"u-{n}", "node": n} for n in names],
                }
            ],
            "addresses": [{"node": n, "address": nodes[n]} for n in names if nodes[n]],
        },
    }


def parsed(obj: dict[str, Any]) -> imex.ImexDomain:
    domain, why = imex.parse_domain(obj)
    assert domain is not None, why
    return domain


# --- the plan object's addresses ---------------------------------------------------------------


def test_the_controller_renders_each_nodes_internal_ip_and_the_driver_parses_it() -> None:
    gangs = [PlacedGang(uid="g1", key="t/g1", since=0.0, nodes=("n2", "n1"), cliques={"n1": "c", "n2": "c"})]
    members = {
        "g1": objects.GangMembers("t", "g1", (imex.Claim("t", "c1", "u1", "n1"), imex.Claim("t", "c2", "u2", "n2")))
    }
    (obj,) = objects.render(
        plan(gangs), members, addresses={"n1": "10.0.0.1", "n2": "10.0.0.2", "x": "10.9.9.9"}
    ).objects
    assert obj["spec"]["addresses"] == [{"node": "n1", "address": "10.0.0.1"}, {"node": "n2", "address": "10.0.0.2"}]
    assert parsed(obj).addresses == (("n1", "10.0.0.1"), ("n2", "10.0.0.2"))
    (bare,) = objects.render(plan(gangs), members).objects  # no address known: the field is left out
    assert "addresses" not in bare["spec"] and parsed(bare).addresses == ()
    node = {
        "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}]},
    }
    assert indexed.node(node).address == "10.0.0.1"
    assert indexed.node({"metadata": {"name": "n1"}}).address == ""


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        ([{"node": "zz", "address": "10.0.0.1"}], "spec.addresses[0].node: 'zz' is not one of the domain's nodes"),
        ([{"node": "n1", "address": "not-an-ip"}], "spec.addresses[0].address: 'not-an-ip' is not an IP address"),
        ([{"node": "n1", "address": "010.0.0.1"}], "is not an IP address"),
        ([{"node": "n1", "address": "::0001"}], "is not in canonical form (::1)"),
        ([{"node": "n1", "address": "10.0.0.1"}, {"node": "n1", "address": "10.0.0.2"}], "'n1' listed twice"),
        ([{"node": "n1", "address": "10.0.0.1"}, {"node": "n2", "address": "10.0.0.1"}], "also another node's"),
        ([{"node": "n1", "address": "10.0.0.1", "port": 1}], "unknown field(s) 'port'"),
        ({"n1": "10.0.0.1"}, "spec.addresses: must be a list"),
    ],
)
def test_a_bad_address_refuses_the_whole_object(addresses: Any, message: str) -> None:
    obj = domain_obj({"n1": "", "n2": ""})
    obj["spec"]["addresses"] = addresses
    domain, why = imex.parse_domain(obj)
    assert domain is None and message in why, why


# --- the pure decisions ------------------------------------------------------------------------


def test_wanted_binds_this_nodes_address_and_lists_every_node_in_node_name_order() -> None:
    d = parsed(domain_obj({"tray-b": "10.0.0.2", "tray-a": "10.0.0.9", "tray-c": "10.0.0.1"}, generation=4))
    got = decide.wanted([d], "tray-b")
    assert got == decide.Wanted(decide.DaemonWant("imex-g1", 4, "10.0.0.2", ("10.0.0.9", "10.0.0.2", "10.0.0.1")), {})
    assert decide.wanted([d], "tray-c").daemon.node_ips == got.daemon.node_ips  # type: ignore[union-attr]
    assert decide.wanted([d], "elsewhere") == decide.Wanted(None, {})


def test_no_daemon_for_a_node_in_two_domains_or_a_domain_missing_an_address() -> None:
    one = parsed(domain_obj({"a": "10.0.0.1", "b": "10.0.0.2"}, name="imex-1"))
    two = parsed(domain_obj({"a": "10.0.0.1", "c": "10.0.0.3"}, name="imex-2"))
    got = decide.wanted([two, one], "a")
    assert got.daemon is None and set(got.refused) == {"imex-1", "imex-2"}
    assert "more than one IMEX domain (imex-1, imex-2)" in got.refused["imex-1"]
    holed = parsed(domain_obj({"a": "10.0.0.1", "b": ""}))
    got = decide.wanted([holed], "a")
    assert got.daemon is None and "has no address for node(s) b" in got.refused["imex-g1"]


def test_next_step() -> None:
    want = decide.DaemonWant("d", 1, "10.0.0.1", ("10.0.0.1", "10.0.0.2"))
    run = decide.Running("d", "10.0.0.1", ("10.0.0.1", "10.0.0.2"), alive=True)
    assert decide.next_step(None, None) == "keep"
    assert decide.next_step(None, run) == "stop"
    assert decide.next_step(want, None) == "start"
    assert decide.next_step(want, run) == "keep"
    assert decide.next_step(want, decide.Running("d", "10.0.0.1", ("10.0.0.1",), alive=True)) == "reload"
    assert decide.next_step(want, decide.Running("other", "10.0.0.1", want.node_ips, alive=True)) == "restart"
    assert decide.next_step(want, decide.Running("d", "10.0.0.7", want.node_ips, alive=True)) == "restart"
    assert decide.next_step(want, decide.Running("d", "10.0.0.1", want.node_ips, alive=False)) == "start"
    assert [decide.restart_delay(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]


def test_files_and_readiness_answer() -> None:
    text = decide.config_text(PurePosixPath("/p/imex"), "10.0.0.1", 50123)
    lines = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert lines["BIND_INTERFACE_IP"] == "10.0.0.1" and lines["SERVER_PORT"] == "50123"
    assert lines["IMEX_NODE_CONFIG_FILE"] == "/p/imex/nodes.cfg"
    assert lines["IMEX_CMD_ENABLED"] == "1" and lines["IMEX_CMD_UNIX_DOMAIN_PATH"] == "/p/imex/cmd.sock"
    assert decide.node_file_text(["10.0.0.2", "10.0.0.1"]) == "10.0.0.2\n10.0.0.1\n"
    assert decide.parse_node_file("# x\n10.0.0.2\n\n10.0.0.1 # y\n") == ("10.0.0.2", "10.0.0.1")
    assert decide.is_ready("READY\n") and not decide.is_ready("NOT_READY\n") and not decide.is_ready("")


def test_merged_status_replaces_only_this_nodes_entry() -> None:
    other = {"node": "b", "ready": True, "observedGeneration": 3}
    mine = decide.status_entry("a", True, "", 3)
    assert mine == {"node": "a", "ready": True, "observedGeneration": 3}
    assert decide.merged_status(None, mine) == [mine]
    assert decide.merged_status([other], mine) == [other, mine]
    stale = {"node": "a", "ready": False, "message": "x", "observedGeneration": 2}
    assert decide.merged_status([stale, other], mine) == [mine, other]
    assert decide.merged_status([mine, other], mine) is None  # nothing to write
    assert len(decide.status_entry("a", False, "m" * 5000, 1)["message"]) == imex.MAX_MESSAGE


def test_prepare_requires_a_status_when_daemons_run() -> None:
    d = parsed(domain_obj({"a": "10.0.0.1", "b": "10.0.0.2"}, generation=2))
    assert imex_claims.not_ready(d) == ()  # no daemons: a domain without status is not waited for
    assert imex_claims.not_ready(d, require_status=True) == ("a", "b")
    obj = domain_obj({"a": "10.0.0.1", "b": "10.0.0.2"}, generation=2)
    obj["status"] = {"nodes": [decide.status_entry("a", True, "", 2), decide.status_entry("b", True, "", 1)]}
    assert imex_claims.not_ready(parsed(obj), require_status=True) == ("b",)  # b reported an older spec


# --- the runner, with the stand-ins ------------------------------------------------------------


def free_port() -> int:
    while True:
        with socket.socket() as probe:
            probe.bind((A, 0))
            port = int(probe.getsockname()[1])
        try:
            with socket.socket() as other:
                other.bind((B, port))
            return port
        except OSError:
            continue


class FakeCluster:
    """The ImexDomain objects, with the status patches the drivers make (resourceVersion checked)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, list[Any]]] = []

    def put(self, obj: dict[str, Any]) -> None:
        old = self.objects.get(obj["metadata"]["name"])
        obj = copy.deepcopy(obj)
        if old is not None:
            obj["status"] = old.get("status")
            obj["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
        self.objects[obj["metadata"]["name"]] = obj

    def list(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.objects.values()))

    def get(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(name))

    def patch_nodes(self, name: str, nodes: list[Any], resource_version: str) -> bool:
        obj = self.objects.get(name)
        if obj is None or obj["metadata"]["resourceVersion"] != resource_version:
            return False
        obj["status"] = {"nodes": copy.deepcopy(nodes)}
        obj["metadata"]["resourceVersion"] = str(int(resource_version) + 1)
        self.patches.append((name, nodes))
        return True

    def entry(self, name: str, node: str) -> dict[str, Any] | None:
        obj = self.objects.get(name) or {}
        return next((e for e in (obj.get("status") or {}).get("nodes") or [] if e["node"] == node), None)


def until(check: Callable[[], object], what: str, runners: list[imex_runner.ImexDaemons], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within:.0f}s: {what}"
        for r in runners:
            r.tick()
        time.sleep(0.1)


def test_two_trays_become_ready_reload_restart_and_stop(tmp_path: Path) -> None:
    api = FakeCluster()
    port = free_port()
    runners = [
        imex_runner.ImexDaemons(
            node,
            tmp_path / node / "imex",
            api.list,
            api,
            binary=str(IMEX),
            ctl_binary=str(CTL),
            port=port,  # type: ignore[arg-type]
        )
        for node in ("tray-0", "tray-1")
    ]
    try:
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=1))
        until(
            lambda: all((api.entry("imex-g1", n) or {}).get("ready") for n in ("tray-0", "tray-1")),
            "both trays report ready",
            runners,
        )
        assert api.entry("imex-g1", "tray-0") == {"node": "tray-0", "ready": True, "observedGeneration": 1}
        assert imex_claims.not_ready(parsed(api.objects["imex-g1"]), require_status=True) == ()
        conf = (tmp_path / "tray-1" / "imex" / "config.cfg").read_text()
        assert f"BIND_INTERFACE_IP={B}" in conf and f"SERVER_PORT={port}" in conf
        assert (tmp_path / "tray-1" / "imex" / "nodes.cfg").read_text() == f"{A}\n{B}\n"
        writes = len(api.patches)
        for r in runners:
            r.tick()
        assert len(api.patches) == writes  # nothing changed: nothing written

        # The domain's spec changes (a new generation) but not its nodes: the same daemons serve it.
        pid = json.loads((tmp_path / "tray-0" / "imex" / "daemon.json").read_text())["pid"]
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=2))
        until(lambda: (api.entry("imex-g1", "tray-0") or {}).get("observedGeneration") == 2, "generation 2", runners)
        assert json.loads((tmp_path / "tray-0" / "imex" / "daemon.json").read_text())["pid"] == pid

        # tray-0's daemon crashes: reported with what to do, restarted with backoff, ready again.
        os.kill(pid, signal.SIGKILL)
        until(
            lambda: "exited with code -9" in (api.entry("imex-g1", "tray-0") or {}).get("message", ""),
            "the crash reported",
            runners,
        )
        said = api.entry("imex-g1", "tray-0")
        assert said is not None and said["ready"] is False and "restarted in 1s" in said["message"], said
        assert "imex-daemon.log" in said["message"]
        until(lambda: (api.entry("imex-g1", "tray-0") or {}).get("ready"), "tray-0 ready after its restart", runners)
        new_pid = json.loads((tmp_path / "tray-0" / "imex" / "daemon.json").read_text())["pid"]
        assert new_pid != pid and api.entry("imex-g1", "tray-0") == {
            "node": "tray-0",
            "ready": True,
            "observedGeneration": 2,
        }

        # The domain is gone: each daemon stopped, its files removed.
        del api.objects["imex-g1"]
        for r in runners:
            r.tick()
        assert not (tmp_path / "tray-0" / "imex").exists() and not (tmp_path / "tray-1" / "imex").exists()
        with pytest.raises(ProcessLookupError):
            for _ in range(50):
                os.kill(new_pid, 0)
                time.sleep(0.1)
    finally:
        for r in runners:
            r.stop()


def test_a_node_change_is_a_reload_and_a_refused_domain_is_reported(tmp_path: Path) -> None:
    api = FakeCluster()
    port = free_port()
    runner = imex_runner.ImexDaemons(
        "tray-0",
        tmp_path / "imex",
        api.list,
        api,
        binary=str(IMEX),
        ctl_binary=str(CTL),
        port=port,  # type: ignore[arg-type]
    )
    try:
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=1))
        until(lambda: api.entry("imex-g1", "tray-0"), "a first report", [runner])
        said = api.entry("imex-g1", "tray-0")
        assert said is not None and said["ready"] is False and "NOT_READY" in said["message"], said  # no peer yet
        pid = json.loads((tmp_path / "imex" / "daemon.json").read_text())["pid"]
        api.put(
            domain_obj({"tray-0": A}, generation=2)
            | {
                "spec": {
                    **domain_obj({"tray-0": A, "tray-1": B})["spec"],
                    "addresses": [{"node": "tray-0", "address": A}],
                }
            }
        )
        runner.tick()  # tray-1 lost its address: no daemon, reported
        said = api.entry("imex-g1", "tray-0")
        assert said is not None and not said["ready"] and "no address for node(s) tray-1" in said["message"], said
        assert not (tmp_path / "imex").exists()
        api.put(domain_obj({"tray-0": A, "tray-1": "127.0.0.53"}, generation=3))
        runner.tick()
        pid = json.loads((tmp_path / "imex" / "daemon.json").read_text())["pid"]
        api.put(domain_obj({"tray-0": A, "tray-1": B}, generation=4))
        runner.tick()  # within a second of its start: the reload waits (SIGUSR1 would end a daemon still starting)
        assert (tmp_path / "imex" / "nodes.cfg").read_text() == f"{A}\n127.0.0.53\n"
        time.sleep(imex_runner.SETTLE_S)
        runner.tick()  # only the node file changed: rewritten, SIGUSR1, same daemon
        assert (tmp_path / "imex" / "nodes.cfg").read_text() == f"{A}\n{B}\n"
        assert json.loads((tmp_path / "imex" / "daemon.json").read_text())["pid"] == pid

        def reloaded() -> bool:
            try:
                record = json.loads((tmp_path / "imex" / "standin-record.json").read_text())
            except (OSError, ValueError):
                return False
            return bool(record["reloads"] >= 1 and record["nodes"] == [A, B] and record["pid"] == pid)

        until(reloaded, "the stand-in re-read its node file", [])
    finally:
        runner.stop()
    assert not (tmp_path / "imex").exists()
