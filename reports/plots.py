"""The report's plots as PNG bytes (matplotlib's Agg canvas; pyplot and its global state are not used).

Each ``plot_*`` returns ``Plot``: a title, PNG bytes or None, and a sentence saying what it shows or why
there is nothing to show. ``make_plots`` raises ``PlotsUnavailable`` when matplotlib is not installed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

from .formatting import badness, fmt_headroom
from .frontier import fmt_bound
from .load import Run, finite, number

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
    # The limit the check was judged against (min(threshold, c x baseline), or a reduction's conditioned limit);
    # the absolute threshold only where the result carries no limit (a results file from before it was recorded).
    limit = finite(r["metrics"].get("limit"))
    threshold = finite(r["metrics"].get("threshold"))
    line, line_label = (limit, f"judged limit {limit:.1e}") if limit else \
        (threshold, f"threshold {threshold:.1e}") if threshold else (None, "")
    if line:
        ax.axhline(line, color="gray", ls="--", lw=1, label=line_label)
    first_bad = number(r["metrics"].get("first_bad_token"))
    if first_bad is not None and math.isfinite(first_bad):
        ax.axvline(first_bad, color="red", ls=":", lw=1.5, label=f"first bad token {int(first_bad)}")
    nonfinite = [x for x, y in zip(xs, ys) if not math.isfinite(y)]
    if nonfinite:
        ax.axvline(nonfinite[0], color="purple", ls="-.", lw=1.5, label=f"first NaN/Inf at token {int(nonfinite[0])}")
        # Non-finite points have no height: mark them along the top, so an all-NaN output still shows where.
        finite_ys = [y for y in ys if math.isfinite(y)]
        top = max(finite_ys + [line or ERROR_FLOOR]) * 4
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
               f"where along the sequence the divergence starts."
               + (f" Dashed: the {line_label}" + (f" (threshold {threshold:.1e})" if limit and threshold else "") + "."
                  if line else ""))
    return Plot(title, _png(fig), caption)


def plot_headroom_histogram(run: Run) -> Plot:
    title = "Headroom (error / limit) histogram"
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
            label=["within the limit", "over the limit"])
    ax.axvline(1.0, color="black", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("headroom = error / judged limit (1 = at the limit)")
    ax.set_ylabel("results")
    ax.legend(fontsize=7)
    caption = f"{len(shown)} results" + (f"; {hidden} with NaN/Inf headroom not shown" if hidden else "") + "."
    return Plot(title, _png(fig), caption)


FRONTIER_X = {
    "gate": ("steepest log-decay |x| (every decay drawn from U(x, -0.1))", lambda v: -v),
    "length": ("sequence length T (tokens)", lambda v: v),
    "scale": ("magnitude of v and q (k under l2norm)", lambda v: v),
}


def plot_frontier(record: dict[str, Any]) -> Plot:
    """Error against the axis: every point (its check nearest the limit: pass, fail, NaN/Inf at the top, stops at
    the bottom), that check's limit, the frontier (last pass to first fail, shaded), and on the length axis the output and state errors next
    to the baseline's."""
    axis = record.get("axis")
    title = f"Frontier: {record.get('backend')} {record.get('op')} {record.get('dtype')}, {axis} axis"
    label, to_x = FRONTIER_X.get(axis, (str(axis), lambda v: v))
    points = sorted((p for p in record.get("points") or [] if finite(p.get("value")) is not None),
                    key=lambda p: to_x(p["value"]))
    if not points or any(to_x(p["value"]) <= 0 for p in points):
        return Plot(title, None, "The record holds no points that can be drawn on a log axis.")
    fig = _figure(width=8.0)
    from matplotlib.ticker import FuncFormatter, NullFormatter  # matplotlib is there: _figure found it

    ax = fig.add_subplot()
    xs = [to_x(p["value"]) for p in points]
    errors = [finite(p.get("worst_rel_rms")) for p in points]
    drawn = [max(e, ERROR_FLOOR) for e in errors if e is not None]
    top, bottom = (max(drawn) * 8 if drawn else 1.0), (min(drawn) / 8 if drawn else ERROR_FLOOR)
    limits = [(x, finite(p.get("limit"))) for x, p in zip(xs, points) if finite(p.get("limit")) is not None]
    if limits:
        ax.plot([x for x, _ in limits], [y for _, y in limits], color="gray", ls="--", lw=1,
                label="limit of the check nearest it")
        top = max(top, max(y for _, y in limits) * 4)
    if axis == "length":
        for check, style in (("forward", "-"), ("state", ":")):
            for source, color in (("rel_rms", "tab:blue"), ("baseline", "tab:orange")):
                line = [(x, finite((p.get(source) or {}).get(check))) for x, p in zip(xs, points)]
                line = [(x, max(y, ERROR_FLOOR)) for x, y in line if y is not None]
                if line:
                    ax.plot(*zip(*line), ls=style, color=color, lw=1,
                            label=f"{'kernel' if source == 'rel_rms' else 'baseline'} {check}")
    for verdicts, color, marker, name in (({"pass"}, "tab:green", "o", "passed"),
                                          ({"fail", "error"}, "tab:red", "o", "failed")):
        sel = [(x, e) for x, e, p in zip(xs, errors, points) if p.get("verdict") in verdicts and e is not None]
        if sel:
            ax.scatter(*zip(*[(x, max(e, ERROR_FLOOR)) for x, e in sel]), color=color, marker=marker, s=26,
                       zorder=3, label=f"{name} (worst rel RMS)")
    nonfinite = [x for x, e, p in zip(xs, errors, points) if e is None and p.get("verdict") in ("fail", "error")]
    if nonfinite:
        ax.scatter(nonfinite, [top] * len(nonfinite), color="tab:red", marker="x", s=36, zorder=3,
                   label="failed: NaN/Inf (or nothing to measure)")
    stops = [x for x, p in zip(xs, points) if p.get("verdict") not in ("pass", "fail", "error")]
    if stops:
        ax.scatter(stops, [bottom] * len(stops), color="gray", marker="^", s=36, label="declined / not judged")
    for last, first in _frontier_pairs(record):
        if last is not None:
            ax.axvline(to_x(last), color="tab:green", lw=1.2)
        if first is not None:
            ax.axvline(to_x(first), color="tab:red", lw=1.2)
        if last is not None and first is not None:
            ax.axvspan(*sorted((to_x(last), to_x(first))), color="tab:red", alpha=0.12)
    ax.set_xscale("log", base=10 if axis == "scale" else 2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("relative RMS error vs fp64")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    caption = (f"last pass {fmt_bound(record.get('last_pass'))}, first fail {fmt_bound(record.get('first_fail'))} "
               f"(resolution {fmt_bound(record.get('resolution'))}; green line: last pass, red line: first fail); "
               f"base case {record.get('base_case')}.")
    return Plot(title, _png(fig), caption)


def _frontier_pairs(record: dict[str, Any]) -> list[tuple[float | None, float | None]]:
    last, first = record.get("last_pass"), record.get("first_fail")
    if record.get("axis") == "scale":
        last = last if isinstance(last, list) else [None, None]
        first = first if isinstance(first, list) else [None, None]
        return [(finite(a), finite(b)) for a, b in zip(last, first)]
    return [(finite(last), finite(first))]


def frontier_plots(run: Run) -> list[Plot]:
    """One plot per frontier record; raises PlotsUnavailable without matplotlib."""
    _matplotlib()
    plots = []
    for record in run.frontiers:
        try:
            plots.append(plot_frontier(record))
        except Exception as exc:  # noqa: BLE001 -- as make_plots: one broken plot must not sink the report
            plots.append(Plot(f"Frontier: {record.get('backend')} {record.get('op')} {record.get('axis')}", None,
                              f"This plot could not be drawn: {type(exc).__name__}: {exc}"))
    return plots


def make_plots(run: Run) -> list[Plot]:
    """All four plots; a single plot that fails says why in its caption instead of sinking the report."""
    _matplotlib()
    plots = []
    for fn, title in ((plot_error_vs_length, "Relative RMS error vs sequence length"),
                      (plot_error_vs_gate, "Relative RMS error vs gate profile"),
                      (plot_worst_token_curve, "Error across tokens, worst case"),
                      (plot_headroom_histogram, "Headroom (error / limit) histogram")):
        try:
            plots.append(fn(run))
        except Exception as exc:  # noqa: BLE001 -- a plotting bug must not cost the person the rest of the report
            plots.append(Plot(title, None, f"This plot could not be drawn: {type(exc).__name__}: {exc}"))
    return plots
