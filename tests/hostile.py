"""Hostile inputs shared by the tests: JSON nested far deeper than any decoder may recurse."""

from __future__ import annotations


def nested(levels: int, leaf: str = '{"x":1}') -> str:
    """JSON text: ``levels`` objects around ``leaf`` (built as text: json.dumps would recurse)."""
    return '{"a":' * levels + leaf + "}" * levels


def claim_text(levels: int, name: str = "deep", namespace: str = "ns") -> str:
    """A ResourceClaim whose opaque parameters (and their managedFields mirror) nest ``levels`` deep."""
    deep = nested(levels)
    params = '{"apiVersion":"gpu.gpuplane.dev/v1alpha1","kind":"GpuConfig","deep":' + deep + "}"
    meta = f'{{"name":"{name}","namespace":"{namespace}","uid":"u-{name}","annotations":{{"k":"v"}},'
    return (
        '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":'
        + meta
        + '"managedFields":[{"fieldsV1":'
        + deep
        + '}]},"spec":{"devices":{"config":[{"opaque":{"driver":"gpu.gpuplane.dev","parameters":'
        + params
        + '}}]}},"status":{"allocation":{"devices":{"results":[]}}}}'
    )


def wrap(prefix: str, inner: str, suffix: str) -> str:
    """``prefix + inner + suffix``: JSON text around a (possibly huge) inner text."""
    return prefix + inner + suffix
