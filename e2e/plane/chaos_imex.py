"""The chaos e2e's IMEX part: gangs across two GB200 trays made and deleted through the faults, and what must hold.

:class:`GangChurn` is a thread that keeps one hand-written GpuGang of :data:`MEMBERS` members x :data:`GPUS`
GPUs alive at a time in the chaos namespace: such a gang cannot sit on one 4-GPU tray, so it spans both, and the
controller writes an ``ImexDomain`` for it (the trays' drivers run their ``nvidia-imex`` stand-ins and prepare
each member with the gang's channel). Every ``interval`` it deletes the live gang once it is ``hold`` seconds
old (a ``GpuGang`` delete: the controller releases its pods and claims) and makes the next one when none is
alive. :meth:`GangChurn.delete_live` deletes the live gang at once: the test calls it right after SIGKILLing the
leader controller, so a gang is deleted while no replica leads (the case that leaked before kopf's ``on.delete``
handler released deleted gangs: ``gpuplane/controller/gang/handlers.py``).

:func:`read_tray` reads what a tray's driver left for IMEX (the channel device nodes in each claim's CDI spec,
the live daemon processes, the daemon directory); :func:`read_api` the namespace's gangs and every
``ImexDomain``. :func:`check` adds the IMEX invariants to a :class:`~e2e.plane.chaos_invariants.Verdict`:

1. every ``ImexDomain`` parses (the driver's own strict parser) and names only gangs that exist with that uid and
   are not being deleted, and claims that exist with their uid;
2. every running member of a gang whose members run on more than one tray is in exactly one domain, on its own
   node, with its gang's channel, and its CDI spec carries exactly that channel's device node;
3. no CDI spec on a tray carries a channel for a claim no domain names there with that channel;
4. every domain is ready on every node of its spec, for the current generation;
5. a tray that some domain lists runs exactly one daemon; a tray none lists runs none and has no daemon directory;
6. every claim a GpuGang owns has its gang (same uid): nothing outlives a deleted gang;
7. every gang not being deleted is ``Running`` (the one :meth:`GangChurn.finish` leaves).

:func:`stuck` names the gangs still ``Terminating`` (a quiet cluster has none).
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from e2e.plane import imex_gangs
from e2e.plane.chaos_invariants import Verdict, pod_claim_names
from e2e.plane.imex_gangs import CHANNELS, GANG_LABEL
from e2e.plane.simnode_plan import SimNode
from gpuplane.api import imex
from gpuplane.driver.prepare import cdi

MEMBERS, GPUS = 2, 3
GANG_GROUP, GANG_VERSION, GANG_PLURAL = "gpuplane.dev", "v1alpha1", "gpugangs"
PREFIX = "chaos-gang"


@dataclasses.dataclass
class GangCounts:
    """What the gang loop did."""

    created: int = 0
    deleted: int = 0
    deleted_leaderless: list[str] = dataclasses.field(default_factory=list)  # deleted right after the leader died
    failed_calls: int = 0


class GangChurn(threading.Thread):
    """Keep one IMEX gang alive at a time, deleting each after ``hold`` seconds (see the module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        interval: float = 2.0,
        hold: float = 25.0,
        out: Callable[[str], None] = print,
    ) -> None:
        super().__init__(name="chaos-gangs", daemon=True)
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.namespace, self.interval, self.hold = namespace, interval, hold
        self.counts = GangCounts()
        self._out = out
        self._lock = threading.Lock()  # one writer at a time: the loop, or the test's delete_live
        self._halt = threading.Event()
        self._n = 0

    def live(self) -> list[tuple[str, float]]:
        """The gangs not being deleted, with their age in seconds (oldest first)."""
        listed = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GANG_GROUP, GANG_VERSION, self.namespace, GANG_PLURAL),
        )
        now = time.time()
        out = []
        for gang in listed.get("items") or []:
            meta = gang.get("metadata") or {}
            if str(meta.get("name", "")).startswith(PREFIX) and not meta.get("deletionTimestamp"):
                made = calendar.timegm(time.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
                out.append((str(meta["name"]), now - made))
        return sorted(out, key=lambda g: -g[1])

    def create_next(self) -> str:
        name = f"{PREFIX}-{self._n:02d}"
        self._n += 1  # a create whose answer was lost may have succeeded: never reuse a name
        gang, *pods = imex_gangs.gang_items(self.namespace, name, MEMBERS, GPUS)
        self.custom.create_namespaced_custom_object(GANG_GROUP, GANG_VERSION, self.namespace, GANG_PLURAL, gang)
        for pod in pods:
            self.core.create_namespaced_pod(self.namespace, cast(Any, pod))
        self.counts.created += 1
        return name

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GANG_GROUP, GANG_VERSION, self.namespace, GANG_PLURAL, name)
        self.counts.deleted += 1

    def ensure_placed(self, timeout: float = 120.0) -> str:
        """A live gang whose members were placed (status phase past Queued); made if none is alive."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                alive = self.live()
                name = alive[0][0] if alive else self.create_next()
            phase = self._phase(name)
            if phase in ("Placed", "Scheduled", "Running"):
                return name
            time.sleep(1.0)
        raise TimeoutError(f"no gang of {MEMBERS} x {GPUS} GB200 GPUs was placed in {timeout:.0f}s")

    def delete_live(self) -> list[str]:
        """Delete every live gang now (the leader was just killed: no replica leads)."""
        with self._lock:
            gone = [name for name, _ in self.live()]
            for name in gone:
                self.delete(name)
            self.counts.deleted_leaderless += gone
        self._out(f"[chaos] deleted gang(s) {gone} with no leader")
        return gone

    def finish(self) -> GangCounts:
        """Stop the loop, leaving one live gang that was not released (its members must run once quiet).

        A gang the controller released during the faults (``Preempted``: its IMEX domain was not ready within
        the bound while a tray's driver was down; its hand-written pods are gone for good), or one short of a
        member pod (its create failed while kube-apiserver was down), is deleted."""
        self.abort()
        for _ in range(30):
            try:
                with self._lock:
                    for name, _ in self.live():
                        if self._phase(name) in ("Preempted", "Failed") or not self._whole(name):
                            self.delete(name)
                    if not self.live():
                        self.create_next()
                return self.counts
            except Exception:  # the apiserver just restarted: try again
                time.sleep(2)
        return self.counts

    def abort(self) -> None:
        """Stop the loop now and leave the gangs as they are (test teardown)."""
        self._halt.set()
        self.join(60)

    def _whole(self, name: str) -> bool:
        """All its member pods exist (a create the restarting apiserver dropped leaves one short for good)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{GANG_LABEL}={name}").items
        return len([p for p in pods if p.metadata is not None and not p.metadata.deletion_timestamp]) == MEMBERS

    def _phase(self, name: str) -> str:
        with contextlib.suppress(Exception):
            gang = self.custom.get_namespaced_custom_object(GANG_GROUP, GANG_VERSION, self.namespace, GANG_PLURAL, name)
            return str((cast(dict[str, Any], gang).get("status") or {}).get("phase", ""))
        return ""

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                with self._lock:
                    alive = self.live()
                    if alive and alive[0][1] >= self.hold:
                        self.delete(alive[0][0])
                    elif not alive:
                        self.create_next()
            except Exception:  # the apiserver may be down: try again on the next tick
                self.counts.failed_calls += 1


@dataclasses.dataclass(frozen=True)
class TrayView:
    """What a tray's driver left for IMEX."""

    name: str
    channels: Mapping[str, tuple[str, ...]]  # claim uid -> the channel device nodes in its CDI spec
    daemons: int  # live processes running the tray's IMEX daemon
    daemon_dir: bool  # <plugin dir>/imex exists


def read_tray(node: SimNode, proc: Path = Path("/proc")) -> TrayView:
    """The channel nodes of each claim's CDI spec, the live daemons and the daemon directory of ``node``."""
    channels = {}
    for uid, path in cdi.list_claim_specs(node.cdi_root).items():
        with contextlib.suppress(OSError, ValueError):
            channels[uid] = tuple(imex_gangs.cdi_channels(json.loads(path.read_text()))[0])
    daemons = len(imex_gangs.daemon_pids(node.plugin_dir, proc))
    return TrayView(node.name, channels, daemons, (node.plugin_dir / "imex").exists())


@dataclasses.dataclass(frozen=True)
class ImexApi:
    """The namespace's GpuGangs and every ImexDomain (raw, as served)."""

    gangs: Sequence[Mapping[str, Any]]
    domains: Sequence[Mapping[str, Any]]


def read_api(api: client.ApiClient, namespace: str) -> ImexApi:
    custom = client.CustomObjectsApi(api)
    gangs = cast(dict[str, Any], custom.list_namespaced_custom_object(GANG_GROUP, GANG_VERSION, namespace, GANG_PLURAL))
    domains = cast(
        dict[str, Any], custom.list_namespaced_custom_object(imex.GROUP, imex.VERSION, imex.NAMESPACE, imex.PLURAL)
    )
    return ImexApi(gangs=gangs.get("items") or [], domains=domains.get("items") or [])


def stuck(view: ImexApi) -> list[str]:
    """Gangs being deleted (released by the leader before kopf lets them go)."""
    metas = [g.get("metadata") or {} for g in view.gangs]
    return [
        f"GpuGang {m.get('namespace')}/{m.get('name')} (deleted at {m['deletionTimestamp']})"
        for m in metas
        if m.get("deletionTimestamp")
    ]


def live_member(view: ImexApi) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a pod is a member of a gang that exists and is not being deleted (it must run once quiet)."""
    alive = {str(g["metadata"]["name"]) for g in view.gangs if not (g.get("metadata") or {}).get("deletionTimestamp")}
    return lambda pod: str(((pod.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)) in alive


def check(
    v: Verdict,
    view: ImexApi,
    pods: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    trays: Sequence[TrayView],
) -> None:
    """The IMEX invariants of the module docstring over one reading."""
    gang_uids = {
        (str(g["metadata"].get("namespace")), str(g["metadata"].get("name"))): str(g["metadata"].get("uid"))
        for g in view.gangs
        if not g["metadata"].get("deletionTimestamp")
    }
    by_key = {f"{c['metadata'].get('namespace')}/{c['metadata'].get('name')}": c for c in claims}
    by_uid = {str(c["metadata"].get("uid")): c for c in claims}
    domains: list[imex.ImexDomain] = []
    for obj in view.domains:
        parsed, err = imex.parse_domain(obj)
        v.expect(parsed is not None, f"ImexDomain {(obj.get('metadata') or {}).get('name')} does not parse: {err}")
        if parsed is not None:
            domains.append(parsed)
    for g in view.gangs:
        meta, phase = g.get("metadata") or {}, (g.get("status") or {}).get("phase")
        if not meta.get("deletionTimestamp"):
            v.expect(phase == "Running", f"GpuGang {meta.get('namespace')}/{meta.get('name')} is {phase}, not Running")
    named: dict[tuple[str, str], tuple[str, int, str]] = {}  # (node, claim uid) -> (domain, channel, gang)
    for d in domains:
        for dg in d.gangs:
            v.expect(
                gang_uids.get((dg.namespace, dg.name)) == dg.uid,
                f"ImexDomain {d.name} names gang {dg.namespace}/{dg.name} ({dg.uid}), which is gone or being deleted",
            )
            for c in dg.claims:
                v.expect(
                    str((by_uid.get(c.uid) or {}).get("metadata", {}).get("name")) == c.name,
                    f"ImexDomain {d.name} names claim {c.namespace}/{c.name} ({c.uid}), which is gone",
                )
                v.expect(
                    (c.node, c.uid) not in named, f"claim {c.namespace}/{c.name} is in two IMEX entries on {c.node}"
                )
                named[(c.node, c.uid)] = (d.name, dg.channel, dg.name)
        status = {s.node: s for s in d.status}
        for node in d.nodes:
            s = status.get(node)
            ok = s is not None and s.ready and s.observedGeneration >= d.generation
            v.expect(ok, f"ImexDomain {d.name} is not ready on {node} for generation {d.generation}: {s}")
    _members(v, pods, by_key, named, {t.name: t for t in trays})
    for tray in trays:
        for uid, paths in sorted(tray.channels.items()):
            entry = named.get((tray.name, uid))
            want = (f"{CHANNELS}{entry[1]}",) if entry else ()
            v.expect(paths == want, f"{tray.name}: CDI spec of claim {uid} carries {list(paths)}, want {list(want)}")
        listed = any(tray.name in d.nodes for d in domains)
        v.expect(
            tray.daemons == (1 if listed else 0), f"{tray.name}: {tray.daemons} IMEX daemons (in a domain: {listed})"
        )
        v.expect(listed or not tray.daemon_dir, f"{tray.name}: an IMEX daemon directory with no domain listing it")
    for claim in claims:
        meta = claim.get("metadata") or {}
        for ref in meta.get("ownerReferences") or []:
            if ref.get("kind") == "GpuGang" and not meta.get("deletionTimestamp"):
                key = (str(meta.get("namespace")), str(ref.get("name")))
                v.expect(
                    gang_uids.get(key) == ref.get("uid"),
                    f"claim {key[0]}/{meta.get('name')} outlives its gang {key[1]}",
                )


def _members(
    v: Verdict,
    pods: Iterable[Mapping[str, Any]],
    by_key: Mapping[str, Mapping[str, Any]],
    named: Mapping[tuple[str, str], tuple[str, int, str]],
    trays: Mapping[str, TrayView],
) -> None:
    running: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        gang = (meta.get("labels") or {}).get(GANG_LABEL)
        if gang and (pod.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp"):
            running.setdefault(str(gang), []).append(pod)
    for gang, members in sorted(running.items()):
        nodes = {str((p.get("spec") or {}).get("nodeName")) for p in members}
        if len(nodes) < 2:
            continue  # inside one node: no IMEX
        channels = set()
        for pod in members:
            node, who = str(pod["spec"]["nodeName"]), f"gang {gang} member {pod['metadata']['name']}"
            for name in pod_claim_names(pod):
                uid = str(
                    ((by_key.get(f"{pod['metadata']['namespace']}/{name}") or {}).get("metadata") or {}).get("uid")
                )
                entry = named.get((node, uid))
                v.expect(
                    entry is not None and entry[2] == gang,
                    f"{who}: claim {name} on {node} is in no IMEX entry of its gang",
                )
                tray = trays.get(node)
                if entry is None or tray is None:
                    continue
                channels.add(entry[1])
                got = tray.channels.get(uid, ())
                v.expect(got == (f"{CHANNELS}{entry[1]}",), f"{who}: its CDI spec on {node} carries {list(got)}")
        v.expect(len(channels) <= 1, f"gang {gang}: its members have channels {sorted(channels)}, not one")
