"""The validation report as one self-contained HTML page.

Everything the page needs is inside it: the CSS inline and the charts as
base64 C{data:image/png} URIs, so the file can be mailed, attached to a CI run
or opened from disk with no network. Every string taken from the summary is
escaped with C{html.escape}, since check examples quote message data.
"""

import base64
import html
import math

from spark_jobs.correctness_chart import (
    CROSS_BACKEND_COLUMN, FAIL, NOT_APPLICABLE, check_outcome, correctness_matrix,
)
from spark_jobs.events import CHECK_DESCRIPTIONS

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.verdict { padding: 0.8em 1.2em; border-radius: 6px; color: white; font-size: 1.3em;
           font-weight: bold; }
.verdict.pass { background: #2e9d4a; }
.verdict.fail { background: #d2352c; }
.verdict ul { font-size: 0.75em; font-weight: normal; margin: 0.4em 0 0 0; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
tr.group th { background: #e6eef7; }
td.pass { background: #dff3e3; }
td.fail { background: #f9d9d6; }
td.absent { background: #f1f1f1; color: #999; }
td.na { background: #dcdcdc; color: #555; }
.reason { display: block; font-size: 0.85em; }
.result { font-weight: bold; }
ul.examples { margin: 0.3em 0 0 0; padding-left: 1.2em; font-family: monospace; font-size: 0.85em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { color: #555; font-size: 0.9em; }
"""

# Rows of the per-backend table: (label, field of the backend's section, number style).
RUN_ROWS = [
    ("published", "published", "count"),
    ("confirmed", "confirmed", "count"),
    ("nacked by the broker", "nacked_by_broker", "count"),
    ("delivered", "delivered", "count"),
    ("redelivered", "redelivered", "count"),
    ("acked", "acked", "count"),
    ("nacked", "nacked", "count"),
    ("rejected", "rejected", "count"),
    ("stored at the end", "stored", "count"),
    ("acks lost to a crash", "acks_lost_to_crash", "count"),
    ("crashes", "crashes", "count"),
    ("wall time (s)", "wall_seconds", "seconds"),
]
# The optional C{cpu} section of a backend (how busy the broker and the clients were), known
# fields first.
CPU_ROWS = [
    ("broker cores busy", "broker_cores", "cores"),
    ("client cores busy", "client_cores", "cores"),
    ("limited by", "limit", "text"),
]
# The C{failover} section of a cluster run (spark_jobs.failover_figures); n/a for other runs.
FAILOVER_ROWS = [
    ("leader failovers", "count", "count"),
    ("mean failover (s)", "mean_seconds", "seconds"),
    ("longest failover (s)", "max_seconds", "seconds"),
]
THROUGHPUT_ROWS = [
    ("publish msgs/s", "publish_msgs_per_s", "rate"),
    ("delivery msgs/s", "deliver_msgs_per_s", "rate"),
    ("publish MB/s", "publish_mb_per_s", "megabytes"),
    ("delivery MB/s", "deliver_mb_per_s", "megabytes"),
]
LATENCY_GROUPS = [("confirm", "confirm latency (ms)"), ("end_to_end", "end-to-end latency (ms)")]
LATENCY_FIELDS = ["count", "p50", "p90", "p99", "max"]

CHART_CAPTIONS = {
    "throughput":
        "Published and delivered messages and megabytes per second over each run, per time"
        " bucket; the dotted lines are the mean rates of the table above, over each run's active"
        " span.",
    "confirm_latency": "Publisher confirm latency: publish to basic.ack, per backend (log scale).",
    "end_to_end_latency": "End-to-end latency: publish to first delivery, per backend (log scale).",
    "correctness":
        "Correctness checks: green passed, red failed, with the violation count; n/a did not"
        " apply.",
}

NOT_AVAILABLE = "n/a"


def escape(value):
    """Any summary value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_value(value, style="count"):
    """A figure as table text: C{n/a} when absent, thousands separators for counts."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NOT_AVAILABLE
    if not _is_number(value):
        return escape(value)
    if style == "count":
        return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
    if style == "seconds":
        return f"{value:,.2f}"
    if style == "rate":
        return f"{value:,.1f}"
    if style == "megabytes":
        return f"{value:,.3f}"
    if style == "cores":
        return f"{value:,.2f}"
    if style == "text":
        return escape(value)
    if style == "milliseconds":
        return f"{value:,.3g}" if value < 100 else f"{value:,.0f}"
    raise ValueError(f"unknown number style {style!r}")


def data_uri(png):
    """A C{data:image/png;base64,...} URI holding PNG bytes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _verdict_section(summary):
    verdict = summary["verdict"]
    columns, rows = correctness_matrix(summary)
    failing = [
        f"{column}: {name}"
        for name, cells in rows
        for column, cell in zip(columns, cells)
        if cell is not None and check_outcome(cell) == FAIL
    ]
    text = verdict.upper()
    if failing:
        text += f": {len(failing)} check{'s' if len(failing) != 1 else ''} failed"
    elif verdict == "pass":
        text += ": every check passed"
    items = "".join(f"<li>{escape(item)}</li>" for item in failing)
    listing = f"<ul>{items}</ul>" if items else ""
    return f'<div class="verdict {escape(verdict)}" id="verdict">{escape(text)}{listing}</div>'


def _settings_section(summary):
    settings = summary.get("settings")
    if not settings:
        return "<h2>Workload</h2><p>The summary records no workload settings.</p>"
    rows = []
    for key, value in settings.items():
        if isinstance(value, list):
            shown = ", ".join(str(item) for item in value)
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = value
        rows.append(f"<tr><th>{escape(key)}</th><td>{escape(shown)}</td></tr>")
    return f'<h2>Workload</h2><table id="settings">{"".join(rows)}</table>'


def _figures_section(summary):
    backends = summary["backends"]
    header = ("<tr><th>figure</th>" + "".join(f"<th>{escape(name)}</th>" for name in backends)
              + "</tr>")
    width = len(backends) + 1

    def group(title):
        return f'<tr class="group"><th colspan="{width}">{escape(title)}</th></tr>'

    def row(label, values, style):
        cell = "<td>{}</td>" if style == "text" else '<td class="number">{}</td>'
        cells = "".join(cell.format(format_value(value, style)) for value in values)
        return f"<tr><th>{escape(label)}</th>{cells}</tr>"

    rows = [group("run")]
    if any("kind" in figures for figures in backends.values()):
        kinds = [figures.get("kind", "backend") for figures in backends.values()]
        rows.append(row("kind", kinds, "text"))
    for label, field, style in RUN_ROWS:
        values = [(figures.get("run") or {}).get(field) for figures in backends.values()]
        rows.append(row(label, values, style))
    cpus = [figures.get("cpu") or {} for figures in backends.values()]
    if any(cpus):
        rows.append(group("cpu"))
        known = {field for _, field, _ in CPU_ROWS}
        others = sorted({field for cpu in cpus for field in cpu} - known)
        other_rows = [(field.replace("_", " "), field, "count") for field in others]
        for label, field, style in CPU_ROWS + other_rows:
            rows.append(row(label, [cpu.get(field) for cpu in cpus], style))
    failovers = [figures.get("failover") for figures in backends.values()]
    if any(failover is not None for failover in failovers):
        rows.append(group("cluster failover"))
        for label, field, style in FAILOVER_ROWS:
            rows.append(row(label, [(failover or {}).get(field) for failover in failovers],
                            style))
    rows.append(group("throughput"))
    for label, field, style in THROUGHPUT_ROWS:
        values = [(figures.get("throughput") or {}).get(field) for figures in backends.values()]
        rows.append(row(label, values, style))
    for kind, title in LATENCY_GROUPS:
        rows.append(group(title))
        latencies = [((figures.get("latency_ms") or {}).get(kind)) or {}
                     for figures in backends.values()]
        for field in LATENCY_FIELDS:
            values = [_latency_figure(latency, field) for latency in latencies]
            rows.append(row(field, values, "count" if field == "count" else "milliseconds"))
    return f'<h2>Figures per backend</h2><table id="figures">{header}{"".join(rows)}</table>'


def _latency_figure(latency, field):
    """A latency figure, or None (shown as n/a) when no latency was measured."""
    if field != "count" and not latency.get("count"):
        return None
    return latency.get(field)


def _image(charts, images, key, alt):
    if key not in images:
        return ""
    return (
        f'<figure><img src="{data_uri(images[key])}" alt="{escape(alt)}">'
        f"<figcaption>{escape(CHART_CAPTIONS[key])} ({escape(charts[key])})</figcaption></figure>"
    )


def _charts_section(charts, images):
    body = "".join(
        _image(charts, images, key, alt)
        for key, alt in (
            ("throughput", "throughput over time"),
            ("confirm_latency", "confirm latency CDF"),
            ("end_to_end_latency", "end-to-end latency CDF"),
        )
    )
    return f"<h2>Charts</h2>{body}" if body else ""


def _not_applicable(check, attributes):
    """A check that did not apply to its run: n/a and why."""
    reason = check.get("reason") or "not applicable to this run"
    return (f'<td class="na" {attributes} title="{escape(reason)}">'
            f'<span class="result">{NOT_APPLICABLE}</span>'
            f'<span class="reason">{escape(reason)}</span></td>')


def _result_cell(cell, column, name):
    attributes = f'data-check="{escape(name)}" data-column="{escape(column)}"'
    if cell is None:
        return f'<td class="absent" {attributes}>&ndash;</td>'
    outcome = check_outcome(cell)
    if outcome == NOT_APPLICABLE:
        return _not_applicable(cell, attributes)
    counts = (f"{format_value(cell.get('violations'))} violations"
              f" of {format_value(cell.get('checked'))} checked")
    return (
        f'<td class="{outcome}" {attributes}><span class="result">{outcome.upper()}</span> '
        f"{counts}{_examples(cell)}</td>"
    )


def _examples(check):
    """A check's examples as an escaped list, or nothing when it has none."""
    items = "".join(f"<li>{escape(example)}</li>" for example in check.get("examples") or [])
    return f'<ul class="examples">{items}</ul>' if items else ""


def _correctness_section(summary, charts, images):
    columns, rows = correctness_matrix(summary)
    if not rows:
        return "<h2>Correctness</h2><p>The summary holds no checks.</p>"
    header = ("<tr><th>check</th>" + "".join(f"<th>{escape(column)}</th>" for column in columns)
              + "</tr>")
    body = "".join(
        f"<tr><th>{escape(name)}</th>"
        + "".join(_result_cell(cell, column, name) for column, cell in zip(columns, cells))
        + "</tr>"
        for name, cells in rows
    )
    meanings = "".join(f"<tr><th>{escape(name)}</th>"
                       f"<td>{escape(CHECK_DESCRIPTIONS.get(name, ''))}</td></tr>"
                       for name, _ in rows)
    return (
        f"<h2>Correctness</h2>{_image(charts, images, 'correctness', 'correctness matrix')}"
        f'<table id="check-meanings"><tr><th>check</th><th>what it checks</th></tr>'
        f'{meanings}</table>'
        f'<table id="correctness">{header}{body}</table>'
    )


def _cross_backend_section(summary):
    checks = (summary.get("cross_backend") or {}).get("checks") or {}
    if not checks:
        return "<h2>Cross-backend checks</h2><p>No cross-backend checks were computed.</p>"
    _, rows = correctness_matrix(summary)
    names = [name for name, cells in rows if cells[-1] is not None and name in checks]
    header = ("<tr><th>check</th><th>result</th><th>checked</th><th>violations</th>"
              "<th>examples</th></tr>")
    body = []
    for name in names:
        check = checks[name]
        outcome = check_outcome(check)
        examples = _examples(check)
        if outcome == NOT_APPLICABLE:
            result = _not_applicable(check, f'data-check="{escape(name)}"')
        else:
            result = f'<td class="{outcome}"><span class="result">{outcome.upper()}</span></td>'
        body.append(
            f'<tr><th>{escape(name)}</th>{result}'
            f'<td class="number">{format_value(check.get("checked"))}</td>'
            f'<td class="number">{format_value(check.get("violations"))}</td>'
            f"<td>{examples}</td></tr>"
        )
    return (
        "<h2>Cross-backend checks</h2><p>Every backend played the same seeded workload; "
        f'these compare them (the &ldquo;{escape(CROSS_BACKEND_COLUMN)}&rdquo; column above).</p>'
        f'<table id="cross-backend">{header}{"".join(body)}</table>'
    )


def render_html(summary, images):
    """
    The report page for a checked summary (see L{spark_jobs.report.write_report}).

    @param summary: the summary, with C{"verdict"} set and C{"charts"} naming
        the chart files.
    @param images: a dict of chart key (as in C{summary["charts"]}) to PNG bytes
        to embed; charts missing from it are left out of the page.
    @return: the page as a string.
    """
    charts = summary.get("charts") or {}
    backends = ", ".join(summary["backends"])
    sections = [
        f"<h1>brokerd cross-backend validation</h1><p>Backends: {escape(backends)}</p>",
        _verdict_section(summary),
        _settings_section(summary),
        _figures_section(summary),
        _charts_section(charts, images),
        _correctness_section(summary, charts, images),
        _cross_backend_section(summary),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>brokerd validation: {escape(summary['verdict'])}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )
