"""gpuplane's informer layer and the controller's one API client: the fleet-sized streams listed, watched and
indexed without kopf's per-object machinery, and the writes made with the same client.

Shared infrastructure (no Kubernetes object semantics here, no import of either program), in the shape
the Kubernetes ecosystem uses (client-go's shared informers and work queues, controller-runtime's cache):

- ``client``: the HTTP client (aiohttp): a paged list, a watch stream and one request (the writes), decoded
  with a nesting bound; :class:`~gpuplane.informer.client.ApiError`, the one error type of the controller's API
  calls; :class:`~gpuplane.informer.client.Resource`, a kind's paths.
- ``blocking``: the same client on an event loop of its own, each request a blocking call: the writes of the
  controller's worker threads and the leader's Lease renewals.
- ``cache``: :class:`~gpuplane.informer.cache.Informer` (paged list restarted on 410, watch resumed from its
  resourceVersion, a decode-time transform, indexes, a synced signal, handlers) and
  :class:`~gpuplane.informer.cache.Caches` (every informer of a process).
- ``workqueue``: keys deduplicated, one worker per key at a time, failures retried with backoff.
"""
