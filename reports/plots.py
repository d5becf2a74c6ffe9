"""The report's plots as PNG bytes (matplotlib's Agg canvas; pyplot and its global state are not used).

Each ``plot_*`` returns ``Plot``: a title, PNG bytes or None, and a sentence saying what it shows or why
there is nothing to show. ``make_plots`` raises ``PlotsUnavailable`` when matplotlib is not installed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

from .load import Run, finite, number
from .summary import badness, fmt_headroom

GATE_ORDER = ("zero", "mild", "typical", "steep", "extreme")
ERROR_FLOOR = 1e-12  # exact results (error 0) are drawn here on the log axes
MARKERS = "osD^v<>ph*"


class PlotsUnavailable(Exception):
    pass


@dataclass
class Plot:
    title: str
    png: bytes | None
    caption: str


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib missing, or broken
        raise PlotsUnavailable(f"matplotlib is not available ({exc}); install it with "
                               f"`pip install 'deltacheck[report]'` and re-run `deltacheck report`") from None
    return Figure, FigureCanvasAgg


def _figure(width: float = 7.5, height: float = 4.2):
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _error_points(run: Run) -> list[dict[str, Any]]:
    """Results with a finite relative RMS error, preferring the forward check (the one every case has)."""
    rows = [r for r in run.results if finite(r["metrics"].get("rel_rms")) is not None]
    forward = [r for r in rows if r["check"] == "forward"]
    return forward or rows


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(f"{r['backend']}:{r['op']}", []).append(r)
    return dict(sorted(out.items()))


def _y(r: dict[str, Any]) -> float:
    return max(finite(r["metrics"].get("rel_rms")) or 0.0, ERROR_FLOOR)


def _scatter_legend(ax, n_series: int) -> None:
    if n_series:
        ax.legend(fontsize=7, loc="best", ncol=2 if n_series > 6 else 1)


def plot_error_vs_length(run: Run) -> Plot:
    title = "Relative RMS error vs sequence length"
    rows = [r for r in _error_points(run) if r["max_len"] > 0]
    if not rows:
        return Plot(title, None, "No result has both a relative RMS error and a known sequence length.")
    fig = _figure()
    ax = fig.add_subplot()
    series = _series(rows)
    for i, (name, rs) in enumerate(series.items()):
        ok = [r for r in rs if r["status"] != "fail"]
        bad = [r for r in rs if r["status"] == "fail"]
        marker = MARKERS[i % len(MARKERS)]
        ax.scatter([r["max_len"] for r in ok], [_y(r) for r in ok], s=18, alpha=0.7, marker=marker, label=name)
        if bad:
            ax.scatter([r["max_len"] for r in bad], [_y(r) for r in bad], s=40, marker=marker,
                       facecolors="none", edgecolors="red", linewidths=1.5, label=f"{name}, failed")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("longest sequence in the case (tokens)")
    ax.set_ylabel("relative RMS error vs fp64")
    ax.grid(True, which="major", alpha=0.3)
    _scatter_legend(ax, len(series))
    check = "forward" if all(r["check"] == "forward" for r in rows) else "all checks"
    return Plot(title, _png(fig), f"{len(rows)} results ({check}); failed results are circled in red.")


def plot_error_vs_gate(run: Run) -> Plot:
    title = "Relative RMS error vs gate profile"
    rows = [r for r in _error_points(run) if r["gate"] and r["gate"] != "?"]
    if not rows:
        return Plot(title, None, "No result has both a relative RMS error and a known gate profile.")
    gates = [g for g in GATE_ORDER if any(r["gate"] == g for r in rows)]
    gates += sorted({r["gate"] for r in rows} - set(gates))
    x_of = {g: i for i, g in enumerate(gates)}
    fig = _figure()
    ax = fig.add_subplot()
    series = _series(rows)
    width = 0.7
    for i, (name, rs) in enumerate(series.items()):
        offset = (i + 0.5) / len(series) * width - width / 2
        xs = [x_of[r["gate"]] + offset for r in rs]
        ax.scatter(xs, [_y(r) for r in rs], s=18, alpha=0.7, marker=MARKERS[i % len(MARKERS)], label=name,
                   edgecolors=["red" if r["status"] == "fail" else "none" for r in rs])
    ax.set_xticks(range(len(gates)), gates)
    ax.set_yscale("log")
    ax.set_xlabel("gate (log-decay) profile, gentle to steep")
    ax.set_ylabel("relative RMS error vs fp64")
    ax.grid(True, axis="y", alpha=0.3)
    _scatter_legend(ax, len(series))
    return Plot(title, _png(fig), f"{len(rows)} results; each backend:op is offset within its profile column.")


def worst_curve_result(run: Run) -> dict[str, Any] | None:
    """The result with a token curve whose headroom (else error) is the worst."""
    with_curve = [r for r in run.results
                  if isinstance(r["metrics"].get("token_curve"), list) and len(r["metrics"]["token_curve"]) > 0]
    if not with_curve:
        return None
    return max(with_curve, key=lambda r: (badness(r["metrics"].get("headroom")), badness(r["metrics"].get("rel_rms"))))


def plot_worst_token_curve(run: Run) -> Plot:
    title = "Error across tokens, worst case"
    r = worst_curve_result(run)
    if r is None:
        return Plot(title, None, "No result carries a token curve (metrics.token_curve).")
    points = []
    for p in r["metrics"]["token_curve"]:
        if isinstance(p, (list, tuple)) and len(p) == 2 and number(p[0]) is not None and number(p[1]) is not None:
            points.append((number(p[0]), number(p[1])))
    if not points:
        return Plot(title, None, f"The token curve of {r['case']} holds no usable [token, error] pairs.")
    fig = _figure(width=8.5)
    ax = fig.add_subplot()
    xs = [p[0] for p in points]
    ys = [max(p[1], ERROR_FLOOR) if math.isfinite(p[1]) else math.nan for p in points]
    ax.plot(xs, ys, lw=1.2, marker="." if len(points) < 60 else None, label="relative error at token")
    threshold = finite(r["metrics"].get("threshold"))
    if threshold:
        ax.axhline(threshold, color="gray", ls="--", lw=1, label=f"tolerance {threshold:.1e}")
    first_bad = number(r["metrics"].get("first_bad_token"))
    if first_bad is not None and math.isfinite(first_bad):
        ax.axvline(first_bad, color="red", ls=":", lw=1.5, label=f"first bad token {int(first_bad)}")
    nonfinite = [x for x, y in zip(xs, ys) if not math.isfinite(y)]
    if nonfinite:
        ax.axvline(nonfinite[0], color="purple", ls="-.", lw=1.5, label=f"first NaN/Inf at token {int(nonfinite[0])}")
        # Non-finite points have no height: mark them along the top, so an all-NaN output still shows where.
        finite_ys = [y for y in ys if math.isfinite(y)]
        top = max(finite_ys + [threshold or ERROR_FLOOR]) * 4
        ax.scatter(nonfinite, [top] * len(nonfinite), marker="x", color="purple", s=12,
                   label=f"NaN/Inf at {len(nonfinite)} of {len(xs)} plotted tokens")
        ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_yscale("log")
    ax.set_xlabel("token index (packed)")
    ax.set_ylabel("relative error")
    ax.set_title(r["case"] if len(r["case"]) <= 90 else r["case"][:87] + "...", fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    caption = (f"{r['backend']} · {r['check']} · {r['status']}, headroom {fmt_headroom(r['metrics'].get('headroom'))}: "
               f"where along the sequence the divergence starts.")
    return Plot(title, _png(fig), caption)


def plot_headroom_histogram(run: Run) -> Plot:
    title = "Headroom (error / tolerance) histogram"
    values = [number(r["metrics"].get("headroom")) for r in run.results]
    values = [v for v in values if v is not None]
    shown = [max(v, 1e-6) for v in values if math.isfinite(v)]
    hidden = len(values) - len(shown)
    if not shown:
        return Plot(title, None, "No result has a finite headroom.")
    fig = _figure()
    ax = fig.add_subplot()
    lo, hi = min(shown), max(shown)
    lo, hi = min(lo, 0.9) / 1.5, max(hi, 1.1) * 1.5
    n_bins = 30
    edges = [lo * (hi / lo) ** (i / n_bins) for i in range(n_bins + 1)]
    under = [v for v in shown if v <= 1.0]
    over = [v for v in shown if v > 1.0]
    ax.hist([under, over], bins=edges, stacked=True, color=["tab:green", "tab:red"],
            label=["within tolerance", "over tolerance"])
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("headroom = error / tolerance (1 = at the limit)")
    ax.set_ylabel("results")
    ax.legend(fontsize=7)
    caption = f"{len(shown)} results" + (f"; {hidden} with NaN/Inf headroom not shown" if hidden else "") + "."
    return Plot(title, _png(fig), caption)


def make_plots(run: Run) -> list[Plot]:
    """All four plots; a single plot that fails says why in its caption instead of sinking the report."""
    _matplotlib()
    plots = []
    for fn, title in ((plot_error_vs_length, "Relative RMS error vs sequence length"),
                      (plot_error_vs_gate, "Relative RMS error vs gate profile"),
                      (plot_worst_token_curve, "Error across tokens, worst case"),
                      (plot_headroom_histogram, "Headroom (error / tolerance) histogram")):
        try:
            plots.append(fn(run))
        except Exception as exc:  # noqa: BLE001 -- a plotting bug must not cost the person the rest of the report
            plots.append(Plot(title, None, f"This plot could not be drawn: {type(exc).__name__}: {exc}"))
    return plots
