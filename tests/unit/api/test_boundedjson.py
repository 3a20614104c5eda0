"""gpuplane.api.boundedjson: depth measured without recursion, deep containers cut out, deep objects quarantined."""

from __future__ import annotations

import json
import sys

import pytest

from gpuplane.api import boundedjson as bj
from tests.hostile import claim_text, nested, wrap


class TestDepthOf:
    @pytest.mark.parametrize(
        ("text", "depth"),
        [
            ("1", 0),
            ('"{[{["', 0),
            ("[]", 1),
            ('{"a":[{}]}', 3),
            ('{"a":"]]]]]]","b":[[[]]]}', 4),  # closing brackets inside a string hide nothing
            (r'{"a":"x\\","b":[[]]}', 3),  # an escaped backslash ends the string
            (r'["\"[[["]', 1),  # an escaped quote does not end it
            (r'{"\\\"[[[[":[]}', 2),
        ],
    )
    def test_counts_containers_outside_strings(self, text: str, depth: int) -> None:
        json.loads(text)  # every case is valid JSON
        assert bj.depth_of(text) == depth

    def test_measures_far_beyond_the_recursion_limit(self) -> None:
        levels = 20 * sys.getrecursionlimit()
        assert bj.depth_of(nested(levels)) == levels + 1


class TestDecode:
    def test_within_the_bound_is_plain_json(self) -> None:
        text = nested(10)
        decoded = bj.decode(text, 64)
        assert decoded.value == json.loads(text) and not decoded.pruned and decoded.depth == 11

    def test_deeper_containers_become_the_marker(self) -> None:
        decoded = bj.decode(nested(5000), 3)
        assert decoded.pruned and decoded.depth == 5001
        assert decoded.value == {"a": {"a": {"a": bj.TOO_DEEP}}}

    def test_siblings_of_a_deep_branch_survive(self) -> None:
        text = wrap('{"keep":{"x":[1,2]},"deep":', nested(3000), ',"after":"]}"}')
        value = bj.decode(text, 4).value
        assert value["keep"] == {"x": [1, 2]} and value["after"] == "]}"
        assert bj.first_cut(value) is not None

    def test_invalid_json_is_a_decode_error(self) -> None:
        with pytest.raises(bj.DecodeError, match="not JSON"):
            bj.decode('{"a": [1, 2}', 64)
        with pytest.raises(bj.DecodeError, match="not UTF-8"):
            bj.decode(b"\xff\xfe", 64)

    def test_bytes_and_text_decode_alike(self) -> None:
        assert bj.decode(b'{"a":"\xc3\xa9"}', 8).value == bj.decode('{"a":"é"}', 8).value


class TestQuarantine:
    def test_a_deep_claim_is_cut_and_marked_naming_the_users_field(self) -> None:
        stub = bj.decode_object(claim_text(1500))
        assert set(stub) == {"apiVersion", "kind", "metadata", "spec", "status", bj.REJECTED}
        assert stub["metadata"] == {"name": "deep", "namespace": "ns", "uid": "u-deep", "annotations": {"k": "v"}}
        assert stub["status"] == {"allocation": {"devices": {"results": []}}}  # what was shallow stays
        assert bj.first_cut(stub["spec"]) is not None  # the deep subtree is the marker, not the data
        reason = bj.rejection(stub)
        assert reason is not None and "deeper than 64 levels" in reason
        assert "spec.devices.config[0].opaque.parameters.deep.a" in reason  # not the managedFields mirror
        assert len(reason) < 400

    def test_an_ordinary_object_is_untouched(self) -> None:
        obj = bj.decode_object(claim_text(10))
        assert bj.rejection(obj) is None and obj["spec"]["devices"]["config"][0]["opaque"]["driver"]

    def test_a_list_keeps_every_other_item(self) -> None:
        items_text = ",".join([claim_text(10, "a"), claim_text(2000, "b"), claim_text(55, "c")])
        text = wrap('{"kind":"ResourceClaimList","items":[', items_text, "]}")
        items = bj.decode_list(text)["items"]
        assert [bj.rejection(i) is None for i in items] == [True, False, True]
        assert items[2]["metadata"]["name"] == "c" and "spec" in items[2]

    def test_a_watch_event_keeps_its_type(self) -> None:
        event = bj.decode_event(wrap('{"type":"MODIFIED","object":', claim_text(5000), "}"))
        assert event["type"] == "MODIFIED" and bj.rejection(event["object"]) is not None

    def test_the_bound_is_relative_to_the_object(self) -> None:
        # 64 levels inside an object are fine whether it arrives alone, in a list or in an event.
        body = wrap('{"metadata":{"name":"x"},"spec":', nested(63), "}")  # the object, 63 wrappers, the leaf: 65
        assert bj.depth_of(body) == 65
        assert bj.rejection(bj.decode_object(body)) is not None
        ok = wrap('{"metadata":{"name":"x"},"spec":', nested(62), "}")  # 64: exactly the bound
        assert bj.depth_of(ok) == 64
        assert bj.rejection(bj.decode_object(ok)) is None
        assert bj.rejection(bj.decode_list(wrap('{"items":[', ok, "]}"))["items"][0]) is None
        assert bj.rejection(bj.decode_event(wrap('{"type":"ADDED","object":', ok, "}"))["object"]) is None
