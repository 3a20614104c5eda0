"""The kubelet-facing gRPC layer of the node driver.

``server.PluginServer`` serves kubelet over unix sockets through thin servicers
(``registration``, ``dra_servicer``, ``health_servicer``, ``grpc_health``) that
translate between wire messages and the core's plain values
(:mod:`gpuplane.driver.prepare.contract`, :mod:`gpuplane.driver.observe.health_view`);
``kubelet_client`` is kubelet's side, for tests and the e2e stand-in. ``wire``
holds typed handles on the generated protobuf code, which lives apart, in
``gpuplane.driver._proto``. ``call_log`` logs one line per call the sockets receive, with the
request's fields; ``socket_names`` names the two sockets per instance (seamless rolling update)
and sweeps the sockets a dead instance left behind.
"""
