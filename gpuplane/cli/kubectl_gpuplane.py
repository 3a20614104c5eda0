"""``kubectl gpuplane``: a kubectl plugin (an executable ``kubectl-gpuplane`` on PATH, installed with the package).

    kubectl gpuplane [--kubeconfig PATH] [--context NAME] [-n NAMESPACE] map [--node NAME ...]
                     [--color auto|always|never] [-o text|html]
    kubectl gpuplane [...] why pod/NAME|resourceclaim/NAME
    kubectl gpuplane [...] usage [--price PER_GPU_HOUR] [-o text|json]

``why`` answers why a pod or claim waits, or what it got (``gpuplane.cli.why``: the controller's
annotations, kube-scheduler's condition, the driver's Events and the claim's ``status.devices``).
``usage`` is per-tenant usage and cost now (``gpuplane.cli.usage``: the GPUs each namespace holds,
by kind and tier, charged as docs/cost.md charges them; with ``--price``, per hour).
``map`` draws the fleet (``gpuplane.cli.fleetmap``): per node and GPU, its memory slices as cells with
the claim that holds each, whole-GPU owners, MPS and time-slice shares with their tier, administrators'
MIG instances, taints and the largest free block; colour on a terminal, plain text when piped (or
with ``NO_COLOR``); ``-o html`` writes the same map as one self-contained page (``gpuplane.cli.fleethtml``).
It reads with the caller's own credentials and says what RBAC hid: without
``list`` on ResourceSlices there is no map (exit 3, with the permission to ask for); without ``list``
on ResourceClaims in every namespace it shows the caller's namespace's claims only and says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client, config

from gpuplane.api import kuberesponse
from gpuplane.cli import fleethtml, fleetmap, usage, why

GROUP, VERSION = "resource.k8s.io", "v1"
EXIT_FORBIDDEN = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl gpuplane", description="gpuplane's view of a GPU fleet")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "-n", "--namespace", help="your namespace, when RBAC lets you read claims there only (default: the context's)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("map", help="per node and GPU: MIG layout, owners, shares and tiers, taints, free blocks")
    m.add_argument("--node", action="append", default=[], help="only this node (repeatable)")
    m.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    m.add_argument(
        "-o", "--output", choices=("text", "html"), default="text", help="html: one self-contained page (fleethtml)"
    )
    w = sub.add_parser(
        "why", help="why a pod or claim waits, or what it got: controller, scheduler, driver in one place"
    )
    w.add_argument("target", help="pod/NAME or resourceclaim/NAME (claim/NAME); a bare NAME is a pod, else a claim")
    u = sub.add_parser("usage", help="per namespace: the GPUs it holds now, by kind and tier, and what they cost")
    u.add_argument("--price", type=float, help="price of one GPU-hour (any currency): adds the cost per hour")
    u.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


def _client(args: argparse.Namespace) -> tuple[client.ApiClient, str]:
    """An API client with the caller's credentials, and the context's namespace."""
    # The kubernetes package leaves these untyped; give them their real types once.
    load: Callable[..., client.ApiClient] = config.new_client_from_config
    contexts: Callable[..., tuple[Any, Any]] = config.list_kube_config_contexts
    in_cluster: Callable[[], None] = config.load_incluster_config
    try:
        api = load(config_file=args.kubeconfig, context=args.context, persist_config=False)
        every, active = contexts(config_file=args.kubeconfig)
        chosen = next((c for c in every or [] if c.get("name") == args.context), None) if args.context else active
        namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")
        return api, namespace
    except config.ConfigException:
        in_cluster()
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return client.ApiClient(), f.read().strip()


def _items(call: Callable[..., Any], **kwargs: Any) -> list[dict[str, Any]]:
    """Every item of a list call, page by page, decoded with gpuplane's bounded JSON reader."""
    items: list[dict[str, Any]] = []
    token = None
    while True:
        page = kuberesponse.read_list(call(_preload_content=False, limit=500, _continue=token, **kwargs))
        items += [i for i in page.get("items") or [] if isinstance(i, dict)]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


class SlicesForbidden(Exception):
    """The caller may not list ResourceSlices: there is no map to draw."""


def read(api: client.ApiClient, namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(slices, claims, what RBAC hid); :class:`SlicesForbidden` (from the 403) when slices may not be listed."""
    custom = client.CustomObjectsApi(api)
    try:
        slices = _items(custom.list_cluster_custom_object, group=GROUP, version=VERSION, plural="resourceslices")
    except client.ApiException as err:
        if err.status == 403:
            raise SlicesForbidden(_message(err)) from err
        raise
    for scope in ("cluster", namespace):
        try:
            if scope == "cluster":
                claims = _items(
                    custom.list_cluster_custom_object, group=GROUP, version=VERSION, plural="resourceclaims"
                )
                return slices, claims, []
            mine = custom.list_namespaced_custom_object
            claims = _items(mine, group=GROUP, version=VERSION, plural="resourceclaims", namespace=namespace)
        except client.ApiException as err:
            if err.status != 403:
                raise
            continue
        return (
            slices,
            claims,
            [
                f"you may not list ResourceClaims in every namespace: only {namespace}'s allocations are drawn; "
                "other tenants' devices show as free here (the scheduler still sees them taken)"
            ],
        )
    return (
        slices,
        [],
        [
            f"you may not list ResourceClaims in every namespace, nor in {namespace}: no allocation is drawn "
            "(name your namespace with -n)"
        ],
    )


def _message(err: client.ApiException) -> str:
    """The Status message of an API error (its reason when the body is not a Status)."""
    try:
        body = kuberesponse.read_object(err.body or b"{}")
    except ValueError:
        body = {}
    return str(body.get("message") if isinstance(body, dict) and body.get("message") else err.reason)[:500]


def _events(core: client.CoreV1Api, namespace: str, names: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        raw = core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
        out += [e for e in kuberesponse.read_list(raw).get("items") or [] if isinstance(e, dict)]
    return out


def explain(api: client.ApiClient, namespace: str, target: str) -> tuple[int, list[str]]:
    """(exit code, lines) for ``why``: 0 found, 1 not found, 3 forbidden."""
    kind, _, name = target.rpartition("/")
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def get_claim(claim_name: str) -> dict[str, Any]:
        raw = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", claim_name, _preload_content=False
        )
        got: dict[str, Any] = kuberesponse.read_object(raw)
        return got

    try:
        pod: dict[str, Any] | None = None
        if kind in ("", "pod", "pods", "po"):
            try:
                pod = kuberesponse.read_object(core.read_namespaced_pod(name, namespace, _preload_content=False))
            except client.ApiException as err:
                if err.status != 404 or kind:
                    raise
        if pod is not None:
            statuses = {
                s.get("name"): s.get("resourceClaimName")
                for s in pod.get("status", {}).get("resourceClaimStatuses") or []
            }
            claim_names = [
                str(r.get("resourceClaimName") or statuses.get(r.get("name")) or "")
                for r in pod.get("spec", {}).get("resourceClaims") or []
            ]
            claims = [get_claim(c) for c in claim_names if c]
        elif kind in ("", "resourceclaim", "resourceclaims", "claim"):
            claims = [get_claim(name)]
        else:
            return 2, [f"kubectl gpuplane why: {kind!r} is neither a pod nor a resourceclaim"]
        events = _events(core, namespace, [name] if pod is None else [name, *(c["metadata"]["name"] for c in claims)])
    except client.ApiException as err:
        if err.status == 404:
            return 1, [f"kubectl gpuplane why: no pod or claim {name!r} in namespace {namespace} (-n names another)"]
        if err.status == 403:
            return EXIT_FORBIDDEN, [f"kubectl gpuplane why: not allowed: {_message(err)}"]
        raise
    return 0, why.render(claims, pod, events)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kubectl-gpuplane``."""
    args = _parser().parse_args(argv)
    if args.command == "usage" and args.price is not None and not 0 <= args.price < float("inf"):
        print(f"kubectl gpuplane usage: --price must be a finite number >= 0, not {args.price}", file=sys.stderr)
        return 2
    api, namespace = _client(args)
    namespace = args.namespace or namespace
    if args.command == "why":
        try:
            code, lines = explain(api, namespace, args.target)
        finally:
            close_why: Callable[[], None] = api.close
            close_why()
        for line in lines:
            print(line, file=sys.stdout if code == 0 else sys.stderr)
        return code
    try:
        slices, claims, hidden = read(api, namespace)
    except SlicesForbidden as err:
        print(
            f"kubectl gpuplane {args.command}: you may not list ResourceSlices (resource.k8s.io/v1, cluster-scoped), "
            "so there is no map to draw; ask an administrator for `list` on resourceslices "
            f"(and on resourceclaims, to see who holds what). The API server said: {err}",
            file=sys.stderr,
        )
        return EXIT_FORBIDDEN
    finally:
        close: Callable[[], None] = api.close
        close()
    fleet = fleetmap.build(slices, claims)
    fleet.hidden += hidden
    if args.command == "usage":
        if args.output == "json":
            print(json.dumps(usage.as_json(fleet, args.price), indent=2))
        else:
            for line in usage.render(fleet, args.price):
                print(line)
        return 0
    if args.node:
        fleet.nodes = {n: g for n, g in fleet.nodes.items() if n in set(args.node)}
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    if not fleet.nodes:
        print(
            "no node publishes gpuplane's devices (driver gpu.gpuplane.dev)" + (" of those named" if args.node else "")
        )
        return 0
    if args.output == "html":
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        sys.stdout.write(fleethtml.render(fleet, generated=f"generated {now}"))
        return 0
    for line in [*fleetmap.render(fleet, colour=colour), *fleetmap.summary(fleet)]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
