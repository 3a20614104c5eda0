"""The MIG offer as this node's driver sees it: the controller's ConfigMap, watched (does I/O).

One watch per driver on one named object (``gpuplane.api.mig_offer``): a change of the offer reaches
every node in one event, and an idle fleet costs the API server nothing but the open watches. Until
the ConfigMap exists (no controller yet, or an install without it) the driver offers every GPU's
MIG placements, as before the offer existed: growing the catalogue is always safe, shrinking it is
the controller's decision. A malformed offer is logged and ignored; the last good one stays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client, watch

from gpuplane.api import mig_offer

log = structlog.get_logger(__name__)
WATCH_TIMEOUT_S = 300
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def node_offer(data: Any, node: str) -> frozenset[str] | None:
    """This node's offered GPUs from a ConfigMap's ``data`` (None: no ConfigMap: every GPU).

    Raises :class:`gpuplane.api.mig_offer.OfferError` when the text is not a valid offer.
    """
    if data is None:
        return None
    text = data.get(mig_offer.DATA_KEY) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise mig_offer.OfferError(f"ConfigMap {mig_offer.CONFIGMAP} has no text under {mig_offer.DATA_KEY}")
    return mig_offer.parse(text).for_node(node)


class OfferWatch:
    """Keeps :meth:`current` equal to this node's offer; calls ``on_change`` (from its thread) when it changes."""

    def __init__(self, api_client: client.ApiClient, node: str, on_change: Callable[[], None]) -> None:
        self.core = client.CoreV1Api(api_client)
        self.node = node
        self.on_change = on_change
        self._offer: frozenset[str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mig-offer-watch", daemon=True)

    def current(self) -> frozenset[str] | None:
        return self._offer

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def read_once(self) -> str:
        """Read the ConfigMap now (start-up, before the first publish); returns its resourceVersion ("" if none)."""
        try:
            cm = self.core.read_namespaced_config_map(mig_offer.CONFIGMAP, mig_offer.NAMESPACE)
        except client.ApiException as err:
            if err.status != 404:
                raise
            self._apply(None, present=False)
            return ""
        self._apply(cm.data, present=True)
        return str(cm.metadata.resource_version or "") if cm.metadata is not None else ""

    def _apply(self, data: Any, *, present: bool) -> None:
        try:
            offer = node_offer(data or {}, self.node) if present else None
        except mig_offer.OfferError as exc:
            log.warning("ignoring a malformed MIG offer; keeping the last one", error=str(exc))
            return
        if offer != self._offer:
            log.info("MIG offer changed", gpus=None if offer is None else sorted(offer))
            self._offer = offer
            self.on_change()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self.read_once()
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]  # the client's watch is untyped
                    self.core.list_namespaced_config_map,
                    mig_offer.NAMESPACE,
                    field_selector=f"metadata.name={mig_offer.CONFIGMAP}",
                    resource_version=version or None,
                    timeout_seconds=WATCH_TIMEOUT_S,
                )
                for event in stream:
                    if self._stop.is_set():
                        return
                    obj = event.get("object")
                    deleted = event.get("type") == "DELETED"
                    self._apply(None if deleted else getattr(obj, "data", None), present=not deleted)
                failures = 0
            except Exception as exc:  # the watch thread outlives any error; the last offer stays
                log.warning("watching the MIG offer failed; retrying", error=str(exc)[:300])
                self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
