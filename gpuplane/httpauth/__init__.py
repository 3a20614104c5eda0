"""Authenticated serving of /metrics, shared by the node driver and the controller.

The way the Kubernetes ecosystem protects a component's metrics (controller-runtime's
secure serving, kube-rbac-proxy): HTTPS, a bearer token on every scrape, validated
with a TokenReview and authorized with a SubjectAccessReview for ``get`` on the
non-resource URL ``/metrics`` (the ``gpuplane-metrics-reader`` ClusterRole grants
it to Prometheus). Kubelet's probes (``/healthz``, ``/readyz``) stay unauthenticated
and say nothing about tenants.

- :mod:`.settings`: the flags both programs take (``--metrics-auth``, TLS files,
  connection cap, request timeout), validated once at start;
- :mod:`.review`: the token and access reviews, with a small bounded cache;
- :mod:`.tls`: the server's certificate (mounted files, or self-signed at start);
- :mod:`.server`: the HTTP server: one thread per connection, a cap on
  connections, a deadline on each (a slow client cannot hold a thread).

Neither program imports the other: both import this package.
"""
