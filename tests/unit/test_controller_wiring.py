"""Controller wiring without a cluster: config parsing, peering priorities, the kopf registry."""

from __future__ import annotations

from controller import config, handlers


def test_config_reads_flags_then_environment() -> None:
    cfg = config.parse_args(["--identity", "pod-a", "--resync", "0.5"], {"GPUPLANE_EVICTION_GRACE": "0"})
    assert cfg.identity == "pod-a" and cfg.resync_s == 0.5 and cfg.eviction_grace_s == 0
    assert cfg.peering_priority == config.default_priority("pod-a")


def test_replicas_get_distinct_default_priorities() -> None:
    # kopf pauses every replica when two share a priority: the default must differ per replica.
    prios = {config.default_priority(f"gpuplane-controller-7d9f8-{s}") for s in ("abcde", "fghij", "klmno")}
    assert len(prios) == 3


def test_registry_has_indexes_and_thin_handlers() -> None:
    reg = handlers.make_registry(config.parse_args(["--identity", "x"], {}))
    ids = {h.id for h in reg._indexing.get_all_handlers()}  # kopf has no public listing
    assert {"gang_idx", "member_pod_idx", "claim_idx", "slice_idx", "node_idx", "class_idx"} <= ids
