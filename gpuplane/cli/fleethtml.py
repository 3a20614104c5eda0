"""The fleet map as one self-contained HTML page (``kubectl gpuplane map -o html``; the demo writes one).

Pure: the fleet map's model (:mod:`gpuplane.cli.fleetmap`) and the per-tenant usage
(:mod:`gpuplane.cli.usage`) in, a page out, with no script and no external resource (it opens from a
file, offline, and a CI artefact can be viewed as is). Each GPU is a row of cells, one per memory
slice, coloured by the claim that holds it (striped when a whole GPU is shared by MPS or time-slicing);
each cell's tooltip names the claim, what it holds and how. Taints are red, the largest free block is
named, what RBAC hid is said at the top. Every string from the cluster is escaped: a claim named
``<script>`` is text.
"""

from __future__ import annotations

from html import escape

from gpuplane.cli import fleetmap, usage
from gpuplane.cli.fleetmap import Fleet, GpuView

# The terminal's ANSI colours (fleetmap.COLOURS) as CSS colours, so that both maps colour a claim alike.
CSS_COLOURS = {
    31: "#d62728",
    32: "#2ca02c",
    33: "#bcbd22",
    34: "#1f77b4",
    35: "#9467bd",
    36: "#17becf",
    91: "#ff7f0e",
    92: "#98df8a",
    93: "#dbdb8d",
    94: "#aec7e8",
    95: "#e377c2",
    96: "#9edae5",
}
FREE = "#eeeeee"

STYLE = """
body { font-family: "DejaVu Sans", sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
h2 { font-size: 15px; margin: 18px 0 6px 0; }
.meta, .hidden { color: #555; font-size: 12px; }
.hidden { color: #8a4b00; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 3px 8px; text-align: left; vertical-align: middle; border-bottom: 1px solid #eee; }
td:nth-child(-n+4) { white-space: nowrap; }
.cells { display: flex; gap: 2px; }
.cell { width: 22px; height: 22px; border: 1px solid #999; font: bold 12px monospace; color: #000;
        display: flex; align-items: center; justify-content: center; box-sizing: border-box;
        text-shadow: 0 0 2px #fff, 0 0 2px #fff; }
.free { background: #eeeeee; color: #aaa; }
.taint { color: #b00000; font-weight: bold; }
.owner { white-space: nowrap; margin-right: 10px; }
.swatch { display: inline-block; width: 10px; height: 10px; border: 1px solid #999; margin-right: 3px; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
"""


def _background(colour: int, shared: bool) -> str:
    css = CSS_COLOURS.get(colour, "#888888")
    if shared:
        return f"background: repeating-linear-gradient(45deg, {css} 0 4px, #ffffff 4px 7px)"
    return f"background: {css}"


def _gpu_row(v: GpuView) -> str:
    cells = []
    for owner, shared in v.cells:
        if owner is None:
            cells.append('<div class="cell free" title="free">&middot;</div>')
            continue
        tip = escape(f"{owner.claim}: {owner.what} ({owner.how})")
        letter = owner.letter
        cells.append(f'<div class="cell" style="{_background(owner.colour, shared)}" title="{tip}">{letter}</div>')
    owners = "".join(
        f'<span class="owner"><span class="swatch" style="{_background(o.colour, False)}"></span>'
        f"{escape(o.letter)}={escape(o.what)} {escape(o.claim)} ({escape(o.how)})</span>"
        for o in v.owners
    )
    extra = ""
    if v.static:
        extra += f"<div>admin MIG: {escape(', '.join(v.static))}</div>"
    if v.taints:
        extra += f'<div class="taint">taint {escape(", ".join(v.taints))}</div>'
    return (
        f"<tr><td>{escape(v.name)}</td><td>{escape(v.product)}</td>"
        f'<td><div class="cells">{"".join(cells)}</div></td><td>{escape(v.free)}</td>'
        f"<td>{owners}{extra}</td></tr>"
    )


def _usage_table(fleet: Fleet, price: float | None) -> str:
    tenants = usage.tally(fleet)
    if not tenants:
        return "<p class='meta'>no allocation</p>"
    head = "".join(f"<th>{k}</th>" for k in ("namespace", "claims", "GPUs", *usage.KINDS, "by tier"))
    head += "<th>cost / hour</th>" if price is not None else ""
    rows = []
    for t in tenants:
        tiers = ", ".join(f"{tier} {v:.2f}" for tier, v in sorted(t.by_tier.items()) if tier != "-") or "-"
        kinds = "".join(f'<td class="num">{t.by_kind[k]:.2f}</td>' for k in usage.KINDS)
        cost = f'<td class="num">{t.gpus * price:.2f}</td>' if price is not None else ""
        rows.append(
            f'<tr><td>{escape(t.namespace)}</td><td class="num">{len(t.claims)}</td>'
            f'<td class="num">{t.gpus:.2f}</td>{kinds}<td>{escape(tiers)}</td>{cost}</tr>'
        )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def render(fleet: Fleet, *, generated: str, price_per_gpu_hour: float | None = None) -> str:
    """The page; ``generated`` is the time (or any label) printed under the title."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>gpuplane fleet map</title>',
        f"<style>{STYLE}</style></head><body>",
        "<h1>gpuplane fleet map</h1>",
        f'<div class="meta">{escape(generated)} &middot; {escape(" ".join(fleetmap.summary(fleet)))}</div>',
    ]
    parts += [f'<div class="hidden">hidden: {escape(h)}</div>' for h in fleet.hidden]
    for node in sorted(fleet.nodes):
        gpus = fleet.nodes[node]
        domains = sorted({g.domain for g in gpus.values() if g.domain})
        parts.append(
            f"<h2>{escape(node)} <span class='meta'>({len(gpus)} GPUs; NVLink domain "
            f"{escape(', '.join(domains) or '-')})</span></h2>"
        )
        rows = "".join(_gpu_row(fleetmap.view(gpus[minor])) for minor in sorted(gpus))
        parts.append(
            "<table><tr><th>GPU</th><th>product</th><th>memory slices</th><th>free</th><th>held by</th></tr>"
            f"{rows}</table>"
        )
    parts += ["<h2>Usage per namespace (GPUs held now)</h2>", _usage_table(fleet, price_per_gpu_hour)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
