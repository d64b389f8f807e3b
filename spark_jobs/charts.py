"""The report's PNG charts of throughput and latency, drawn from a validation
summary with matplotlib (the correctness matrix is in
L{spark_jobs.correctness_chart}).

Figures are built as C{matplotlib.figure.Figure} objects rendered by the Agg
canvas, without pyplot: no global figure registry to leak into, nothing that
needs a display, and every chart has a fixed size in pixels whatever the data.
Each chart has a C{*_figure} function returning its Figure, for a caller that
wants to look at what was drawn, and a C{*_chart} one returning PNG bytes.

A backend keeps one style in every chart (L{backend_styles}): its colour,
dash pattern, hollow marker and line width all differ from the others', so
backends stay apart in grey print and for readers who do not tell the colours
apart. Lines are drawn widest first with their markers staggered, so series
that are identical remain distinguishable: each wider line shows around the
narrower ones drawn over it, and every backend's markers sit at its own points.
"""

import io
import math
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

DPI = 100
THROUGHPUT_SIZE = (12.0, 7.5)  # inches; at DPI, 1200 x 750 pixels
LATENCY_SIZE = (8.0, 5.0)

# One style per backend, the same in every chart (colours: matplotlib's tab10 cycle).
SERIES_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf")
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<")
# Dotted is kept for the mean-rate lines.
SERIES_DASHES = ("-", "--", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (1, 1, 4, 1)), (0, (8, 3)))
WIDEST_LINE, LINE_WIDTH_STEP, NARROWEST_LINE = 2.8, 0.7, 1.0
MEAN_LINE_STYLE = ":"
# About this many markers on each line, however many points it has.
MARKS_PER_LINE = 14
# The throughput panels' y axes reach this far above the highest point, leaving
# the top of each panel to its legend.
LEGEND_HEADROOM = 1.45
# Latencies at or below zero (clock granularity) are drawn here on the log axis.
SMALLEST_LATENCY_MS = 1e-3
# (series and mean-rate field, panel title, unit) of the throughput chart's panels, row by row.
THROUGHPUT_PANELS = (
    ("publish_msgs_per_s", "published messages", "msgs/s"),
    ("publish_mb_per_s", "published megabytes", "MB/s"),
    ("deliver_msgs_per_s", "delivered messages", "msgs/s"),
    ("deliver_mb_per_s", "delivered megabytes", "MB/s"),
)
# Summaries written before series had bucket widths hold per-second counts under
# C{second}: the count field and its factor to each rate.
PER_SECOND_FIELDS = {
    "publish_msgs_per_s": ("published", 1.0), "deliver_msgs_per_s": ("delivered", 1.0),
    "publish_mb_per_s": ("published_bytes", 1e-6), "deliver_mb_per_s": ("delivered_bytes", 1e-6),
}


@dataclass(frozen=True)
class BackendStyle:
    """How one backend's lines look; C{rank} is its place in the summary (draw order)."""

    colour: str
    dashes: object
    marker: str
    linewidth: float
    rank: int
    backends: int

    def line(self, points):
        """Keyword arguments for C{Axes.plot} of one of this backend's lines of C{points} points."""
        # Every backend marks every step-th point from its own offset, so none shares a marked
        # point.
        step = max(self.backends, math.ceil(points / MARKS_PER_LINE))
        offset = (self.rank * step // self.backends) % max(points, 1)
        return {
            "color": self.colour, "linestyle": self.dashes, "linewidth": self.linewidth,
            "marker": self.marker, "markevery": (offset, step),
            "markerfacecolor": "none", "markeredgewidth": 1.4, "markersize": 7,
            "zorder": 2 + self.rank,
        }


def backend_styles(summary):
    """A dict of backend name to its L{BackendStyle}, in the summary's backend order."""
    count = len(summary["backends"])
    return {
        name: BackendStyle(
            colour=SERIES_COLOURS[index % len(SERIES_COLOURS)],
            dashes=SERIES_DASHES[index % len(SERIES_DASHES)],
            marker=SERIES_MARKERS[index % len(SERIES_MARKERS)],
            linewidth=max(NARROWEST_LINE, WIDEST_LINE - LINE_WIDTH_STEP * index),
            rank=index,
            backends=count)
        for index, name in enumerate(summary["backends"])
    }


def backend_colours(summary):
    """A dict of backend name to its line colour, in the summary's backend order."""
    return {name: style.colour for name, style in backend_styles(summary).items()}


def display_name(name, figures):
    """A backend's name as charts show it: a reference broker's says so, as does a cluster's
    named otherwise than C{cluster}."""
    kind = figures.get("kind")
    if kind == "reference" or (kind == "cluster" and name != kind):
        return f"{name} ({kind})"
    return name


def series_rates(throughput, field):
    """
    C{(starts, rates, width)} of one rate (C{field}, e.g. C{publish_msgs_per_s})
    of a backend's throughput series: every bucket from the first to the last
    one present, a bucket the summary left out counting 0 (a broker down after
    a crash shows as a drop, not a straight line across the gap). Points with a
    C{second} instead of a C{start_s} (summaries written before buckets had
    widths) are counts per whole second.
    """
    width = throughput.get("bucket_seconds") or 1.0
    rates = {}
    for point in throughput.get("series") or []:
        if "start_s" in point:
            index, rate = round(point["start_s"] / width), point.get(field) or 0
        else:
            count_field, factor = PER_SECOND_FIELDS[field]
            index, rate = point["second"], (point.get(count_field) or 0) * factor
        rates[index] = rates.get(index, 0) + rate
    if not rates:
        return [], [], width
    indexes = range(0, max(rates) + 1)
    return [index * width for index in indexes], [rates.get(index, 0) for index in indexes], width


def format_duration(seconds):
    """A bucket width as text: C{10 ms}, C{0.5 s}, C{30 s}."""
    return f"{seconds * 1000:g} ms" if seconds < 0.1 else f"{seconds:g} s"


def format_rate(value, unit):
    """A mean rate for a legend: n/a when the summary has none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "n/a"
    return f"{value:,.1f} {unit}" if unit == "msgs/s" else f"{value:,.3f} {unit}"


def png(figure):
    """The figure rendered as PNG bytes (fixed size: no tight bounding box)."""
    FigureCanvasAgg(figure)
    output = io.BytesIO()
    figure.savefig(output, format="png", dpi=DPI, metadata={"Software": None})
    figure.clear()
    return output.getvalue()


def no_data(axes, text):
    """Says C{text} across empty axes, whose ticks would mean nothing."""
    axes.set_xticks([])
    axes.set_yticks([])
    axes.text(0.5, 0.5, text, transform=axes.transAxes, ha="center", va="center", color="#666666")


def _draw_rate(axes, name, figures, style, field, unit):
    """One backend's series of C{field}, a point in the middle of each bucket, and its mean rate
    flat over its active span; the bucket width (None when there is no series)."""
    throughput = figures.get("throughput") or {}
    starts, rates, width = series_rates(throughput, field)
    if not starts:
        return None
    mean = throughput.get(field)
    axes.plot([start + width / 2 for start in starts], rates, gid=f"series {name}",
              label=f"{display_name(name, figures)}: mean {format_rate(mean, unit)}",
              **style.line(len(starts)))
    active = throughput.get(f"{field.split('_', 1)[0]}_active_s")
    if active and isinstance(mean, (int, float)):
        axes.plot(active, [mean, mean], color=style.colour, linestyle=MEAN_LINE_STYLE,
                  linewidth=1.6, marker=style.marker, markersize=6, zorder=20 + style.rank,
                  gid=f"mean {name}")
    return width


def _bucket_note(widths):
    """What one point of the throughput chart stands for."""
    if not widths:
        return ""
    if len(set(widths.values())) == 1:
        return f"each point: the rate in one {format_duration(next(iter(widths.values())))} bucket"
    each = ", ".join(f"{name} {format_duration(width)}" for name, width in widths.items())
    return f"each point: the rate in one bucket ({each})"


def throughput_figure(summary):
    """
    The throughput Figure: published and delivered messages and megabytes per
    second over each run, one panel each, one line per backend (the rate in
    each time bucket, drawn at the bucket's middle), and each backend's mean
    rate (the report table's figure) as a dotted line over its active span,
    ending in its marker.
    """
    figure = Figure(figsize=THROUGHPUT_SIZE, dpi=DPI, layout="constrained")
    panels = figure.subplots(2, 2, sharex=True)
    styles = backend_styles(summary)
    widths = {}
    for axes, (field, title, unit) in zip(panels.flat, THROUGHPUT_PANELS):
        for name, figures in summary["backends"].items():
            width = _draw_rate(axes, name, figures, styles[name], field, unit)
            if width is not None:
                widths[name] = width
        axes.set_title(f"{title} per second")
        axes.set_ylabel(unit)
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: plain_number(value)))
        axes.grid(True, alpha=0.3)
        if axes.lines:
            highest = max(max(line.get_ydata(), default=0) for line in axes.lines)
            axes.set_ylim(0, max(highest, 1e-9) * LEGEND_HEADROOM)
            axes.legend(loc="upper right", fontsize="small", framealpha=0.9,
                        ncols=1 + len(styles) // 5)
        else:
            no_data(axes, f"no {title} recorded")
    for axes in panels[1]:
        axes.set_xlabel("seconds since the run's first event")
    mean_key = Line2D([], [], color="#555555", linestyle=MEAN_LINE_STYLE, linewidth=1.6, marker="o")
    note = _bucket_note(widths)
    figure.legend([mean_key],
                  [f"mean rate over the run's active span, as in the table"
                   f"{'; ' + note if note else ''}"],
                  loc="outside upper center", fontsize="small", frameon=False)
    return figure


def throughput_chart(summary):
    """PNG bytes of L{throughput_figure}."""
    return png(throughput_figure(summary))


def plain_number(value):
    """A tick value as plain digits: C{0}, C{0.5}, C{2.5}, C{10}, C{1,000}, C{10,000} (no powers
    of ten)."""
    return f"{value:,.12g}"


def log_ticks(low, high):
    """Tick values from C{low} to C{high} on a log axis: powers of ten when three fit, else 1-2-5
    steps."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    candidates = {multiple: [step * 10.0 ** exponent
                             for exponent in range(first, last + 1) for step in multiple]
                  for multiple in ((1,), (1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9))}
    for multiple, values in candidates.items():
        inside = [value for value in values
                  if low <= value * (1 + 1e-9) and value <= high * (1 + 1e-9)]
        if len(inside) >= 3 or multiple == (1, 2, 3, 4, 5, 6, 7, 8, 9):
            return inside


def _format_ms(value):
    """A latency for a legend, in plain milliseconds: C{0.52 ms}, C{12.3 ms}, C{1,270 ms}."""
    if value is None:
        return "n/a"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.3g} ms"


def latency_cdf_figure(summary, kind, title):
    """
    The Figure of one latency's CDF (C{kind} is C{"confirm"} or
    C{"end_to_end"}) per backend, milliseconds on a log scale ticked in plain
    numbers.
    """
    figure = Figure(figsize=LATENCY_SIZE, dpi=DPI, layout="constrained")
    axes = figure.subplots()
    styles = backend_styles(summary)
    for name, figures in summary["backends"].items():
        latency = ((figures.get("latency_ms") or {}).get(kind)) or {}
        points = latency.get("cdf") or []
        if not points:
            continue
        xs = [max(point[0], SMALLEST_LATENCY_MS) for point in points]
        ys = [point[1] for point in points]
        label = (f"{display_name(name, figures)} (p50 {_format_ms(latency.get('p50'))},"
                 f" p99 {_format_ms(latency.get('p99'))})")
        axes.plot(xs, ys, drawstyle="steps-post", label=label, **styles[name].line(len(xs)))
    axes.set_title(title)
    axes.set_xlabel("latency (ms, log scale)")
    axes.set_ylabel("fraction of messages")
    axes.set_ylim(0, 1.02)
    axes.grid(True, which="both", alpha=0.3)
    if axes.lines:
        axes.set_xscale("log")
        axes.autoscale_view()
        low, high = axes.get_xlim()
        ticks = log_ticks(low, high)
        axes.set_xticks(ticks, [plain_number(value) for value in ticks])
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.legend(loc="best", fontsize="small")
    else:
        no_data(axes, "no latencies recorded")
    return figure


def latency_cdf_chart(summary, kind, title):
    """PNG bytes of L{latency_cdf_figure}."""
    return png(latency_cdf_figure(summary, kind, title))
