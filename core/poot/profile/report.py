"""A profiled step as people read it: a table per launch and per family, a Chrome/Perfetto trace
(``chrome://tracing``, ui.perfetto.dev) and a roofline picture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import PootError
from .step import StepProfile

__all__ = ["chrome_trace", "format_profile", "plot_roofline", "write_trace"]


def _rate(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def _size(n: int) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _share(x: float, peak: float | None) -> str:
    return f"{x / peak:4.0%}" if peak else "   -"


def format_profile(p: StepProfile, top: int | None = None) -> str:
    """The per-launch table (plan order; ``top``: only the longest that many), the families, and
    the launches' sum beside the step's wall time."""
    bw = p.peak.bytes_per_s if p.peak else None
    fl = p.peak.flops_per_s if p.peak else None
    what = "decode" if p.tokens == 1 else f"prefill of {p.tokens} tokens each"
    lines = [
        f"{p.model} on {p.device}: a {what} step of {p.batch} sequence{'s' if p.batch != 1 else ''} "
        f"({p.padded_tokens} tokens after bucketing, context {p.context}), {len(p.launches)} launches"
    ]
    if p.peak:
        lines.append(f"peak: {_rate(p.peak.bytes_per_s, 'B/s')} memory, {_rate(p.peak.flops_per_s, 'FLOP/s')} ({p.peak.source})")
    else:
        lines.append("peak: not known for this device (rates are shown without their share of it)")
    shown = p.launches if top is None else sorted(sorted(p.launches, key=lambda l: -l.seconds)[:top], key=lambda l: l.index)
    lines.append("")
    lines.append(f"{'#':>4}  {'family':16s} {'kernel':44s} {'grid':>12}  {'µs':>8}  {'bytes':>10}  {'bandwidth':>12} {'bw%':>4}  {'FLOP/s':>14} {'fl%':>4}")
    for l in shown:
        grid = "x".join(str(g) for g in l.grid)
        kernel = l.kernel if len(l.kernel) <= 44 else l.kernel[:41] + "..."
        lines.append(
            f"{l.index:4d}  {l.family[:16]:16s} {kernel:44s} {grid:>12}  {l.seconds * 1e6:8.1f}  {_size(l.bytes):>10}  "
            f"{_rate(l.bytes_per_s, 'B/s'):>12} {_share(l.bytes_per_s, bw)}  {_rate(l.flops_per_s, 'FLOP/s'):>14} {_share(l.flops_per_s, fl)}"
        )
    if top is not None and top < len(p.launches):
        lines.append(f"      ({len(p.launches) - top} shorter launches not shown)")
    lines.append("")
    lines.append(f"{'family':18s} {'launches':>8}  {'ms':>8}  {'share':>6}  {'bytes':>10}  {'bandwidth':>12} {'bw%':>4}  {'FLOP/s':>14} {'fl%':>4}")
    total = p.launch_seconds or 1.0
    for f in p.families():
        b = f.bytes / f.seconds if f.seconds else 0.0
        r = f.flops / f.seconds if f.seconds else 0.0
        lines.append(
            f"{f.family[:18]:18s} {f.launches:8d}  {f.seconds * 1e3:8.3f}  {f.seconds / total:6.1%}  {_size(f.bytes):>10}  "
            f"{_rate(b, 'B/s'):>12} {_share(b, bw)}  {_rate(r, 'FLOP/s'):>14} {_share(r, fl)}"
        )
    ratio = p.launch_seconds / p.wall_seconds if p.wall_seconds else 0.0
    moved = sum(l.bytes for l in p.launches)
    lines.append("")
    lines.append(
        f"launches {p.launch_seconds * 1e3:.3f} ms in all, the whole step {p.wall_seconds * 1e3:.3f} ms (median of {len(p.walls)}): "
        f"the launches are {ratio:.0%} of it; {_size(moved)} moved, {_rate(moved / p.wall_seconds if p.wall_seconds else 0, 'B/s')} over the step"
        + (f" ({moved / p.wall_seconds / p.peak.bytes_per_s:.0%} of peak)" if p.peak and p.wall_seconds else "")
    )
    return "\n".join(lines)


def chrome_trace(p: StepProfile) -> dict[str, Any]:
    """The step as a Chrome trace (the JSON object format): one complete event ("X") per launch,
    back to back in plan order on the device's track, each with its grid, bytes, FLOPs and rates;
    the step's wall time on a track of its own."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"poot {p.model} on {p.device}"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "launches (each timed alone)"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "whole step (median)"}},
    ]
    t = 0.0
    for l in p.launches:
        dur = l.seconds * 1e6
        events.append(
            {
                "name": l.kernel,
                "cat": l.family,
                "ph": "X",
                "ts": round(t, 3),
                "dur": round(dur, 3),
                "pid": 1,
                "tid": 1,
                "args": {
                    "index": l.index,
                    "grid": list(l.grid),
                    "bytes": l.bytes,
                    "flops": l.flops,
                    "GB/s": round(l.bytes_per_s / 1e9, 3),
                    "GFLOP/s": round(l.flops_per_s / 1e9, 3),
                },
            }
        )
        t += dur
    events.append(
        {"name": "step", "cat": "step", "ph": "X", "ts": 0, "dur": round(p.wall_seconds * 1e6, 3), "pid": 1, "tid": 2, "args": {"launches": len(p.launches)}}
    )
    meta: dict[str, Any] = {"model": p.model, "device": p.device, "batch": p.batch, "tokens": p.tokens, "context": p.context}
    if p.peak:
        meta.update(peak_bytes_per_s=p.peak.bytes_per_s, peak_flops_per_s=p.peak.flops_per_s, peak_source=p.peak.source)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": meta}


def write_trace(p: StepProfile, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(p)))
    return path


def plot_roofline(p: StepProfile, path: str | Path) -> Path:
    """A roofline picture: each launch at its arithmetic intensity (FLOP per byte) and achieved
    FLOP/s, sized by its time and coloured by family, under the device's memory and compute roofs
    (where its peak is known). Needs matplotlib: ``pip install 'poot[plot]'``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PootError("--plot draws with matplotlib, which is not installed: pip install 'poot[plot]'") from None
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    pts = [l for l in p.launches if l.bytes > 0 and l.flops > 0 and l.seconds > 0]
    if not pts:
        raise PootError("no launch moved bytes and did FLOPs: nothing to place on a roofline")
    lo = min(l.flops / l.bytes for l in pts) / 2
    hi = max(l.flops / l.bytes for l in pts) * 2
    if p.peak:
        ridge = p.peak.flops_per_s / p.peak.bytes_per_s
        lo, hi = min(lo, ridge / 8), max(hi, ridge * 8)
        xs = [lo, ridge, hi]
        ax.plot(xs, [min(p.peak.flops_per_s, p.peak.bytes_per_s * x) for x in xs], color="black", lw=1.5, label=f"roof ({p.peak.source})")
    longest = max(l.seconds for l in pts)
    colours = plt.get_cmap("tab20")
    for i, fam in enumerate(f.family for f in p.families()):
        ls = [l for l in pts if l.family == fam]
        if ls:
            xs, ys = [l.flops / l.bytes for l in ls], [l.flops_per_s for l in ls]
            ax.scatter(xs, ys, s=[12 + 240 * l.seconds / longest for l in ls], alpha=0.6, color=colours(i % 20), label=fam)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved FLOP/s")
    what = "decode" if p.tokens == 1 else f"prefill x{p.tokens}"
    ax.set_title(f"{p.model} on {p.device}: {what}, batch {p.batch} (marker area: time)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
