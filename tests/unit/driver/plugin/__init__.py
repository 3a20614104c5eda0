"""Tests of :mod:`gpuplane.driver.plugin`: the kubelet plugin's gRPC servers, protos and sockets.

- ``test_driver_grpc``: The node driver end to end over its real unix sockets, with a kubelet-side client from the
  same protos.
- ``test_plugin_health``: PluginServer health (gRPC health, the kubelet health stream), shutdown and sockets, over
  real unix sockets.
- ``test_plugin_health_board``: HealthBoard: the in-memory HealthSource behind the DRAResourceHealth stream.
- ``test_plugin_protos``: The generated protobuf code: kubelet's wire facts, and that regenerating changes nothing.
- ``test_plugin_rolling``: Two plugin instances on one node (a seamless rolling update): own socket names, no
  interference, stale sweep.
- ``test_plugin_server``: PluginServer over real unix sockets, driven by the kubelet-side client and raw stubs.
"""
