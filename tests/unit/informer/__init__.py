"""Tests of :mod:`gpuplane.informer`: the informer, its HTTP client and the work queue.

- ``test_blocking_client``: the controller's writes over HTTP (BlockingClient): answers, errors with their causes,
  no answer, a call from its own loop refused; Resource paths.
- ``test_informer``: gpuplane.informer: Informer and Client against a real local HTTP server, plus Informer.apply
  and Caches.
- ``test_informer_endpoint``: gpuplane.informer.client.Endpoint from the ``kubernetes`` client's configuration (what
  main() builds it from).
- ``test_workqueue``: gpuplane.informer.workqueue: keys deduplicated, one run per key at a time, failures retried, a
  ready gate.
"""
