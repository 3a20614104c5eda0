"""Tests of :mod:`gpuplane.httpauth`: the metrics and health endpoints' authentication and binding.

- ``test_metrics_auth``: Issue 32, defect 8: /metrics wants a bearer token allowed to ``get /metrics``; the server
  bounds its connections.
- ``test_request_reviewer``: gpuplane.httpauth.review.RequestReviewer: the TokenReview and SubjectAccessReview it
  posts, and its answers read as untrusted.
- ``test_metrics_binding``: Metrics and health endpoints bind to localhost (or the pod IP the manifests pass), never
  to every interface.
"""
