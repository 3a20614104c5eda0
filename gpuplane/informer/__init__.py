"""gpuplane's informer layer: the fleet-sized streams listed, watched and indexed, without kopf's per-object machinery.

Shared infrastructure (no Kubernetes object semantics here, no import of either program), in the shape
the Kubernetes ecosystem uses (client-go's shared informers and work queues, controller-runtime's cache):

- ``client``: the HTTP client (aiohttp): a paged list and a watch stream, decoded with a nesting bound.
- ``cache``: :class:`~gpuplane.informer.cache.Informer` (paged list restarted on 410, watch resumed from its
  resourceVersion, a decode-time transform, indexes, a synced signal, handlers) and
  :class:`~gpuplane.informer.cache.Caches` (every informer of a process).
- ``workqueue``: keys deduplicated, one worker per key at a time, failures retried with backoff.
"""
