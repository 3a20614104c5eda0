"""Watches the DRA-overhead benchmark keeps on its pods and claims: when each was created, bound, allocated, Running.

Each watch lists and watches one namespaced collection in a thread and records the monotonic
arrival time of each transition (this process's clock, as the latencies). Reads the API only.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from bench.dra.dra_setup import NAMESPACE
from e2e.plane import kubelet_dra, kubelet_pods


class _Watch:
    """One list+watch of a namespaced collection in a thread; ``_event`` sees every event (monotonic arrival)."""

    def __init__(self, list_call: Callable[..., Any]) -> None:
        self._list = list_call
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Start watching; returns once the watch is established."""
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as err:  # the control plane going away at the end of the run, or a broken round
            if not self._stop.is_set():
                print(f"watch failed: {err}", file=sys.stderr, flush=True)

    def _follow(self) -> None:
        listed: Any = self._list(_preload_content=False)
        version = json.loads(listed.data)["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            response: Any = self._list(watch=True, resource_version=version, timeout_seconds=30, _preload_content=False)
            self._ready.set()
            for line in kubelet_pods.stream_lines(response):
                now = time.monotonic()
                event = json.loads(line)
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion", version)
                self._event(event["type"], obj, now)
                if self._stop.is_set():
                    break
            response.release_conn()


class RunningWatch(_Watch):
    """When each pod of a round is first seen bound, with claim statuses, Running (monotonic clock)."""

    def __init__(self, api: client.ApiClient, round_label: str) -> None:
        core = client.CoreV1Api(api)
        selector = f"bench-round={round_label}"
        super().__init__(lambda **kw: core.list_namespaced_pod(NAMESPACE, label_selector=selector, **kw))
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.claim_status: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.gone: set[str] = set()

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"].get("name")
        if kind == "DELETED":
            self.gone.add(name)
            return
        status = obj.get("status") or {}
        self.created.setdefault(name, now)
        if (obj.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if status.get("resourceClaimStatuses"):
            self.claim_status.setdefault(name, now)
        if status.get("phase") == "Running":
            self.running.setdefault(name, now)


class ClaimWatch(_Watch):
    """When each pod's generated ResourceClaim is first seen (created), allocated, reserved (monotonic clock)."""

    def __init__(self, api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        super().__init__(
            lambda **kw: custom.list_namespaced_custom_object(
                kubelet_dra.GROUP, kubelet_dra.VERSION, NAMESPACE, "resourceclaims", **kw
            )
        )
        self.created: dict[str, float] = {}  # keyed by the owning pod's name
        self.allocated: dict[str, float] = {}
        self.reserved: dict[str, float] = {}

    def _event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if kind not in ("ADDED", "MODIFIED"):
            return
        owners = [o["name"] for o in obj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Pod"]
        if not owners:
            return
        pod_name = owners[0]
        self.created.setdefault(pod_name, now)
        status = obj.get("status") or {}
        if status.get("allocation"):
            self.allocated.setdefault(pod_name, now)
        if status.get("reservedFor"):
            self.reserved.setdefault(pod_name, now)


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll until ``predicate``; raise after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
