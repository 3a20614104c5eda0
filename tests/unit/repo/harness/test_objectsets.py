"""e2e.plane.objectsets: what the kustomize/helm comparison ignores, and that it catches everything else."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from e2e.plane import objectsets


def daemonset(managed_by: str = "kustomize") -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "d", "app.kubernetes.io/managed-by": managed_by}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d", "namespace": "ns", "labels": dict(labels)},
        "spec": {
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": "c", "image": "i:1", "args": ["--a"]}]},
            }
        },
    }


def crd(version_label: bool, rule: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": "gpuplane"}
    if version_label:
        labels["app.kubernetes.io/version"] = "0.1.0"
    return {
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "x.example", "labels": labels},
        "spec": {"versions": [{"x-kubernetes-validations": [{"rule": rule, "message": "m  m"}]}]},
    }


class TestDifferences:
    def test_tool_labels_are_ignored(self) -> None:
        assert objectsets.differences([daemonset("kustomize")], [daemonset("Helm")]) == []

    def test_a_changed_field_is_reported_with_its_path(self) -> None:
        other = daemonset("Helm")
        other["spec"]["template"]["spec"]["containers"][0]["image"] = "i:2"
        diff = objectsets.differences([daemonset()], [other])
        assert diff == [
            "('DaemonSet', 'ns', 'd'): .spec.template.spec.containers[0].image: 'i:1' != 'i:2'",
        ]

    def test_a_missing_object_or_field_is_reported(self) -> None:
        other = daemonset()
        del other["spec"]["template"]["spec"]["containers"][0]["args"]
        extra = copy.deepcopy(other)
        extra["metadata"]["name"] = "e"
        diff = objectsets.differences([daemonset()], [other, extra])
        assert "('DaemonSet', 'ns', 'e'): only in the second" in diff
        assert any(".containers[0].args: only in the first" in line for line in diff)

    def test_other_labels_count(self) -> None:
        other = daemonset()
        other["metadata"]["labels"]["app.kubernetes.io/version"] = "9"
        assert objectsets.differences([daemonset()], [other])

    def test_crd_version_label_and_cel_whitespace_are_ignored(self) -> None:
        kustomized = crd(True, "a ||\n\n  b")
        chart = crd(False, "a ||\n  b")
        assert objectsets.differences([kustomized], [chart]) == []

    def test_cel_tokens_and_non_cel_strings_still_count(self) -> None:
        assert objectsets.differences([crd(True, "a || b")], [crd(True, "a && b")])
        other = crd(True, "a")
        other["spec"]["versions"][0]["x-kubernetes-validations"][0]["message"] = "m m"
        assert objectsets.differences([crd(True, "a")], [other])

    def test_an_object_rendered_twice_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="twice"):
            objectsets.differences([daemonset(), daemonset()], [])
