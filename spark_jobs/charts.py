"""The report's PNG charts, drawn from a validation summary with matplotlib.

Figures are built as L{matplotlib.figure.Figure} objects rendered by the Agg
canvas, without pyplot: no global figure registry to leak into, nothing that
needs a display, and every chart has a fixed size in pixels whatever the data.
"""

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from spark_jobs.events import BACKEND_CHECKS, CROSS_BACKEND_CHECKS

DPI = 100
THROUGHPUT_SIZE = (10.0, 6.0)  # inches; at DPI, 1000 x 600 pixels
LATENCY_SIZE = (8.0, 5.0)
CORRECTNESS_SIZE = (10.0, 6.0)

CROSS_BACKEND_COLUMN = "all"

PASS_COLOUR = "#2e9d4a"
FAIL_COLOUR = "#d2352c"
ABSENT_COLOUR = "#e4e4e4"
# One colour per backend, the same in every chart (matplotlib's tab10 cycle).
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# The matrix keeps cells at most this small a share of the chart, so one
# backend with one check does not fill the picture with one cell.
MATRIX_MIN_COLUMNS, MATRIX_MIN_ROWS = 4, 9
# Per-second series this short get a marker on every point.
MARKED_SERIES_LENGTH = 60
# Latencies at or below zero (clock granularity) are drawn here on the log axis.
SMALLEST_LATENCY_MS = 1e-3


def backend_colours(summary):
    """A dict of backend name to its line colour, in the summary's backend order."""
    return {name: SERIES_COLOURS[index % len(SERIES_COLOURS)] for index, name in enumerate(summary["backends"])}


def _ordered(names, canonical):
    return [name for name in canonical if name in names] + sorted(name for name in names if name not in canonical)


def correctness_matrix(summary):
    """
    The correctness matrix: C{(columns, rows)}.

    C{columns} are the backend names, then L{CROSS_BACKEND_COLUMN} when the
    summary has cross-backend checks. Each row is C{(check_name, cells)} with one
    cell per column: the check's dict from the summary, or C{None} where that
    check does not apply or was not computed. Per-backend checks come first,
    then the cross-backend ones, each group in L{BACKEND_CHECKS} /
    L{CROSS_BACKEND_CHECKS} order.
    """
    backends = summary["backends"]
    cross = (summary.get("cross_backend") or {}).get("checks") or {}
    columns = list(backends) + ([CROSS_BACKEND_COLUMN] if cross else [])
    backend_check_names = {name for figures in backends.values() for name in (figures.get("checks") or {})}
    rows = []
    for name in _ordered(backend_check_names, BACKEND_CHECKS):
        cells = [(figures.get("checks") or {}).get(name) for figures in backends.values()]
        rows.append((name, cells + ([None] if cross else [])))
    for name in _ordered(set(cross), CROSS_BACKEND_CHECKS):
        rows.append((name, [None] * len(backends) + [cross[name]]))
    return columns, rows


def per_second_counts(series, field):
    """
    C{(seconds, counts)} of one series field with every second from 0 to the
    last one present, seconds the summary left out counting 0 (a broker down
    after a crash shows as a drop to zero, not a straight line across the gap).
    """
    counts = {}
    for point in series:
        counts[point["second"]] = counts.get(point["second"], 0) + (point.get(field) or 0)
    if not counts:
        return [], []
    seconds = list(range(0, max(counts) + 1))
    return seconds, [counts.get(second, 0) for second in seconds]


def _png(figure):
    """The figure rendered as PNG bytes (fixed size: no tight bounding box)."""
    FigureCanvasAgg(figure)
    output = io.BytesIO()
    figure.savefig(output, format="png", dpi=DPI, metadata={"Software": None})
    figure.clear()
    return output.getvalue()


def _no_data(axes, text):
    """Says C{text} across empty axes, whose ticks would mean nothing."""
    axes.set_xticks([])
    axes.set_yticks([])
    axes.text(0.5, 0.5, text, transform=axes.transAxes, ha="center", va="center", color="#666666")


def throughput_chart(summary):
    """PNG bytes: published and delivered messages per second over the run, one line per backend."""
    figure = Figure(figsize=THROUGHPUT_SIZE, dpi=DPI, layout="constrained")
    published_axes, delivered_axes = figure.subplots(2, 1, sharex=True)
    colours = backend_colours(summary)
    for axes, field, title in ((published_axes, "published", "published"), (delivered_axes, "delivered", "delivered")):
        drawn = False
        for name, figures in summary["backends"].items():
            series = (figures.get("throughput") or {}).get("series") or []
            seconds, counts = per_second_counts(series, field)
            if seconds:
                marker = "." if len(seconds) <= MARKED_SERIES_LENGTH else None
                axes.plot(seconds, counts, color=colours[name], label=name, linewidth=1.4, marker=marker)
                drawn = True
        axes.set_title(f"{title} messages per second")
        axes.set_ylabel("msgs/s")
        axes.grid(True, alpha=0.3)
        if drawn:
            axes.set_ylim(bottom=0)
            axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        else:
            _no_data(axes, f"no {title} messages recorded")
    delivered_axes.set_xlabel("seconds since the run's first event")
    return _png(figure)


def _format_ms(value):
    return "n/a" if value is None else f"{value:.3g} ms"


def latency_cdf_chart(summary, kind, title):
    """
    PNG bytes: the CDF of one latency (C{kind} is C{"confirm"} or
    C{"end_to_end"}) per backend, milliseconds on a log scale.
    """
    figure = Figure(figsize=LATENCY_SIZE, dpi=DPI, layout="constrained")
    axes = figure.subplots()
    colours = backend_colours(summary)
    drawn = False
    for name, figures in summary["backends"].items():
        latency = ((figures.get("latency_ms") or {}).get(kind)) or {}
        points = latency.get("cdf") or []
        if not points:
            continue
        xs = [max(point[0], SMALLEST_LATENCY_MS) for point in points]
        ys = [point[1] for point in points]
        label = f"{name} (p50 {_format_ms(latency.get('p50'))}, p99 {_format_ms(latency.get('p99'))})"
        axes.step(xs, ys, where="post", color=colours[name], label=label, linewidth=1.6)
        drawn = True
    axes.set_title(title)
    axes.set_xlabel("latency (ms, log scale)")
    axes.set_ylabel("fraction of messages")
    axes.set_ylim(0, 1.02)
    axes.grid(True, which="both", alpha=0.3)
    if drawn:
        axes.set_xscale("log")
        axes.legend(loc="lower right", fontsize="small")
    else:
        _no_data(axes, "no latencies recorded")
    return _png(figure)


def correctness_chart(summary):
    """
    PNG bytes: the correctness matrix, one row per check and one column per
    backend (plus L{CROSS_BACKEND_COLUMN}); a green cell passed, a red one
    failed, both show the violation count; grey cells do not apply.
    """
    columns, rows = correctness_matrix(summary)
    figure = Figure(figsize=CORRECTNESS_SIZE, dpi=DPI, layout="constrained")
    axes = figure.subplots()
    for row_index, (_, cells) in enumerate(rows):
        for column_index, cell in enumerate(cells):
            if cell is None:
                colour, text = ABSENT_COLOUR, ""
            else:
                colour = PASS_COLOUR if cell["pass"] else FAIL_COLOUR
                violations = cell.get("violations")
                text = "pass" if cell["pass"] else "FAIL"
                if violations is not None:
                    text += f"\n{violations:,}"
            axes.add_patch(_cell(column_index, row_index, colour))
            if text:
                axes.text(column_index + 0.5, row_index + 0.5, text, ha="center", va="center",
                          color="white", fontsize=9, fontweight="bold")
    axes.set_xlim(0, max(len(columns), MATRIX_MIN_COLUMNS))
    axes.set_ylim(max(len(rows), MATRIX_MIN_ROWS), 0)
    axes.set_xticks([index + 0.5 for index in range(len(columns))], columns)
    axes.set_yticks([index + 0.5 for index in range(len(rows))], [name for name, _ in rows])
    axes.xaxis.tick_top()
    axes.tick_params(length=0)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.set_title("correctness checks (violations per cell)", pad=24)
    if not rows:
        _no_data(axes, "no checks computed")
    return _png(figure)


def _cell(column, row, colour):
    """One matrix cell, inset a little so neighbouring cells stay apart."""
    return Rectangle((column + 0.03, row + 0.05), 0.94, 0.9, facecolor=colour, edgecolor="none")
