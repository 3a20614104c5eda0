"""What the controller's claim index holds per ResourceClaim: the API's body against the index entry, in bytes.

    python -m bench claim_index_memory [--claims 10000] [--against REV]

The fleet's claims as ``bench.fleet.fleet_state`` writes them (one to four whole GPUs each, reserved
for their pod, a third with the gang decision annotation), encoded and decoded as JSON so every
string is fresh as the API's decoder gives it; then each kept in a list, with ``tracemalloc`` counting
what the list holds on a second pass (Python's own allocations; the strings a first pass interned and the
requests shared between claims are not counted again, as in a running controller):

- ``body``: the decoded bodies themselves (what an index of whole objects would hold);
- ``index``: ``gpuplane.controller.indexed.claim`` of this tree on the same bodies;
- ``index@REV`` (``--against REV``): the same function of another commit (``git show
  REV:gpuplane/controller/indexed.py``, loaded beside this tree's modules), side by side.

Deterministic input (no randomness); prints one line per side and each side against ``body``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from gpuplane.api import names as dn  # noqa: E402
from gpuplane.controller import indexed, names  # noqa: E402

NODES = 1000


def claim_body(i: int) -> dict[str, Any]:
    """Claim ``i`` of the fleet: a template member's, allocated on node ``i % 1000``, reserved for its pod."""
    gpus = 1 + i % 4
    pod = f"job-{i}"
    meta: dict[str, Any] = {
        "name": f"{pod}-gpus-{i:05x}",
        "namespace": f"team-{i % 20}",
        "uid": f"{i:08x}-0000-4000-8000-{i:012x}",
        "resourceVersion": str(100000 + i),
        "creationTimestamp": "2026-12-07T04:00:00Z",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"p{i:07x}", "controller": True}],
        "managedFields": [
            {"manager": "kube-controller-manager", "operation": "Update", "fieldsType": "FieldsV1"},
            {"manager": "kube-scheduler", "operation": "Update", "subresource": "status", "fieldsType": "FieldsV1"},
        ],
    }
    if i % 3 == 0:
        meta["annotations"] = {names.ANNOTATION_DECISION: f"gang-{i // 8}/{i % 8}@{'d' * 32}"}
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpuplane.dev", "count": gpus}}
    results = [
        {"driver": dn.DRIVER_NAME, "request": "gpus", "pool": f"node-{i % NODES}", "device": f"gpu-{k}"}
        for k in range(gpus)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [request]}},
        "status": {
            "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": []}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"p{i:07x}"}],
        },
    }


def held_bytes(make: Callable[[int], Any], count: int) -> int:
    """Bytes still allocated after ``make(i)`` for every ``i`` is kept (what a list of them holds).

    Measured on a second pass: the first one interns the short strings (a process's table of interned
    strings grows by resizing, megabytes at once, whenever it fills), as a running controller has them.
    """
    warm = [make(i) for i in range(count)]
    del warm
    tracemalloc.start()
    try:
        kept = [make(i) for i in range(count)]
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return current


def load_other(rev: str) -> ModuleType:
    """``gpuplane/controller/indexed.py`` at ``rev``, as a module of its own beside this tree's."""
    text = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{rev}:gpuplane/controller/indexed.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="indexed-")) / "indexed_other.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("indexed_other", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load indexed.py of {rev}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["indexed_other"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="claim_index_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=10000, help="claims to hold (default 10000)")
    parser.add_argument("--against", metavar="REV", help="also the index entry of this commit's indexed.py")
    args = parser.parse_args(argv)
    bodies = [json.dumps(claim_body(i)) for i in range(args.claims)]
    sides: list[tuple[str, Callable[[int], Any]]] = [
        ("body", lambda i: json.loads(bodies[i])),
        ("index", lambda i: indexed.claim(json.loads(bodies[i]))),
    ]
    if args.against:
        other = load_other(args.against)
        sides.append((f"index@{args.against}", lambda i: other.claim(json.loads(bodies[i]))))
    print(f"{args.claims} ResourceClaims held (tracemalloc, bytes still allocated):")
    figures: dict[str, int] = {}
    for name, make in sides:
        print(f"  {name}: measuring...", flush=True)
        figures[name] = held_bytes(make, args.claims)
    width = max(len(n) for n in figures) + 2
    for name, got in figures.items():
        ratio = figures["body"] / got if got else float("inf")
        print(f"{name:<{width}}{got / 1e6:8.2f} MB  {got / args.claims:7.0f} B/claim  body/this {ratio:5.2f}x")
    if args.against:
        now, then = figures["index"], figures[f"index@{args.against}"]
        print(f"index now / index@{args.against}: {now / then:.2f} ({(then - now) / 1e6:.2f} MB less)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
