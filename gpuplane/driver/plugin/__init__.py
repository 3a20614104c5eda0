"""The kubelet-facing gRPC layer of the node driver.

``types`` holds the plain values and interfaces the rest of the driver uses;
``server.PluginServer`` serves them to kubelet over unix sockets through thin
servicers (``registration``, ``dra_servicer``, ``health_servicer``,
``grpc_health``); ``kubelet_client`` is kubelet's side, for tests and the e2e
stand-in. Generated protobuf code lives apart, in ``driver._proto``.
"""
