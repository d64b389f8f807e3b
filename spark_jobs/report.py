"""Writes the cross-backend validation report: C{summary.json}, C{report.html}
and the PNG charts, from the summary the Spark analysis computed.

The summary is a plain dict (its shape is agreed with L{spark_jobs.analysis}):
a C{verdict}, the workload C{settings}, per backend its C{run} counts,
C{throughput} (mean rates, their C{*_active_s} spans, C{bucket_seconds} and a
C{series} of buckets: L{spark_jobs.figures}), C{latency_ms} (C{confirm} and
C{end_to_end}: count, percentiles and a CDF) and C{checks}, optionally its
C{kind} (C{backend}, C{cluster} or C{reference}), C{cpu} (C{broker_cores},
C{client_cores}, C{limit} and any other figures) and, for a cluster, its
C{failover} (C{count}, C{mean_seconds}, C{max_seconds}), and the C{cross_backend}
checks. A check marked C{"applicable": false}, with a C{reason}, is shown as
n/a and left out of the verdict. Only C{backends} is required: a part the
analysis could not compute is shown as C{n/a}, never guessed. Series points
with a C{second} instead of a C{start_s}, from summaries written before buckets
had widths, are read as per-second counts.

Re-render a report from a summary (after editing the report code, say)::

    brokerd-report out/summary.json out/        # or:
    python -m spark_jobs.report out/summary.json out/
"""

import argparse
import json
import math
import pathlib
import sys

from spark_jobs.charts import latency_cdf_chart, throughput_chart
from spark_jobs.correctness_chart import FAIL, check_outcome, correctness_chart
from spark_jobs.events import RUN_KINDS, check_applies
from spark_jobs.report_html import render_html

SUMMARY_FILE = "summary.json"
HTML_FILE = "report.html"
CHART_FILES = {
    "throughput": "throughput.png",
    "confirm_latency": "confirm_latency_cdf.png",
    "end_to_end_latency": "end_to_end_latency_cdf.png",
    "correctness": "correctness.png",
}
CONFIRM_LATENCY_TITLE = "publisher confirm latency (publish to basic.ack)"
END_TO_END_LATENCY_TITLE = "end-to-end latency (publish to first delivery)"
VERDICTS = ("pass", "fail")
LATENCY_KINDS = ("confirm", "end_to_end")
CPU_LIMITS = ("broker", "clients", "unknown")
ACTIVE_SPANS = ("publish_active_s", "deliver_active_s")


class SummaryError(ValueError):
    """A summary is not shaped as the report expects; the message names the part."""


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(value):
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _require_object(value, path, optional=True):
    """C{value} as a dict; C{{}} for an absent optional part; L{SummaryError} otherwise."""
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise SummaryError(f"summary: {path} must be an object, not {_describe(value)}")
    return value


def _require_numbers(section, path, integers=False, skip=()):
    """Every value of C{section} but those named in C{skip} is a number (an integer if
    C{integers}) or null."""
    for key, value in section.items():
        if key in skip or value is None:
            continue
        if not _is_number(value) or (integers and not isinstance(value, int)):
            kind = "an integer" if integers else "a number"
            raise SummaryError(f"summary: {path}.{key} must be {kind} or null,"
                               f" not {_describe(value)}")


def _check_series(series, path):
    if not isinstance(series, list):
        raise SummaryError(f"summary: {path} must be a list of time buckets,"
                           f" not {_describe(series)}")
    for index, point in enumerate(series):
        point_path = f"{path}[{index}]"
        point = _require_object(point, point_path, optional=False)
        if "second" in point and "start_s" not in point:
            # A summary from before buckets had widths: counts per whole second.
            second = point["second"]
            if not isinstance(second, int) or isinstance(second, bool) or second < 0:
                raise SummaryError(f"summary: {point_path}.second must be an integer >= 0,"
                                   f" not {_describe(second)}")
        else:
            start = point.get("start_s")
            if not _is_number(start) or start < 0:
                raise SummaryError(f"summary: {point_path}.start_s must be a number >= 0,"
                                   f" not {_describe(start)}")
        _require_numbers(point, point_path)


def _check_throughput(throughput, path):
    _require_numbers(throughput, path, skip=("series",) + ACTIVE_SPANS)
    width = throughput.get("bucket_seconds")
    if width is not None and width <= 0:
        raise SummaryError(f"summary: {path}.bucket_seconds must be above 0,"
                           f" not {_describe(width)}")
    for name in ACTIVE_SPANS:
        span = throughput.get(name)
        if span is not None and not (isinstance(span, list) and len(span) == 2
                                     and all(map(_is_number, span)) and span[0] <= span[1]):
            raise SummaryError(f"summary: {path}.{name} must be a [from, to] pair of seconds"
                               f" or null, not {_describe(span)}")
    _check_series(throughput.get("series") or [], f"{path}.series")


def _check_cpu(cpu, path):
    _require_numbers(cpu, path, skip=("limit",))
    if "limit" in cpu and cpu["limit"] not in CPU_LIMITS:
        raise SummaryError(f"summary: {path}.limit must be one of {', '.join(CPU_LIMITS)},"
                           f" not {_describe(cpu['limit'])}")


def _check_latency(latency, path):
    _require_numbers(latency, path, skip=("cdf",))
    points = latency.get("cdf") or []
    if not isinstance(points, list):
        raise SummaryError(
            f"summary: {path}.cdf must be a list of [latency_ms, fraction] pairs,"
            f" not {_describe(points)}"
        )
    for index, point in enumerate(points):
        if not (isinstance(point, list) and len(point) == 2
                and all(_is_number(part) for part in point)):
            raise SummaryError(
                f"summary: {path}.cdf[{index}] must be a [latency_ms, fraction] pair of numbers,"
                f" not {_describe(point)}"
            )
        if not 0 <= point[1] <= 1:
            raise SummaryError(f"summary: {path}.cdf[{index}] has fraction {point[1]},"
                               f" outside 0..1")


def _check_checks(checks, path):
    for name, check in checks.items():
        check = _require_object(check, f"{path}.{name}", optional=False)
        if "applicable" in check and not isinstance(check["applicable"], bool):
            raise SummaryError(f"summary: {path}.{name}.applicable must be true or false,"
                               f" not {_describe(check['applicable'])}")
        if check.get("applicable") is False:
            if not isinstance(check.get("reason", ""), str):
                raise SummaryError(f"summary: {path}.{name}.reason must be a string,"
                                   f" not {_describe(check['reason'])}")
        elif not isinstance(check.get("pass"), bool):
            raise SummaryError(f"summary: {path}.{name}.pass must be true or false,"
                               f" not {_describe(check.get('pass'))}")
        counts = {key: check.get(key) for key in ("checked", "violations")}
        _require_numbers(counts, f"{path}.{name}", integers=True)
        if not isinstance(check.get("examples") or [], list):
            raise SummaryError(f"summary: {path}.{name}.examples must be a list,"
                               f" not {_describe(check['examples'])}")
        if not isinstance(check.get("applicable", True), bool):
            raise SummaryError(f"summary: {path}.{name}.applicable must be true or false, not"
                               f" {_describe(check['applicable'])}")
        if not check_applies(check) and not isinstance(check.get("reason"), str):
            raise SummaryError(f"summary: {path}.{name} does not apply, and its reason must say"
                               f" why, not {_describe(check.get('reason'))}")


def check_summary(summary):
    """
    Raises L{SummaryError}, naming the part, unless C{summary} has the shape the
    report reads: C{backends} an object of at least one backend, and every
    optional part present of the right type.
    """
    summary = _require_object(summary, "the summary", optional=False)
    if "verdict" in summary and summary["verdict"] not in VERDICTS:
        raise SummaryError(f"summary: verdict must be 'pass' or 'fail',"
                           f" not {_describe(summary['verdict'])}")
    _require_object(summary.get("settings"), "settings")
    backends = _require_object(summary.get("backends"), "backends")
    if not backends:
        raise SummaryError("summary: backends is missing or empty; there is nothing to report")
    for name, figures in backends.items():
        path = f"backends.{name}"
        figures = _require_object(figures, path, optional=False)
        if figures.get("kind", RUN_KINDS[0]) not in RUN_KINDS:
            raise SummaryError(f"summary: {path}.kind must be one of {', '.join(RUN_KINDS)}, not"
                               f" {_describe(figures['kind'])}")
        notes = figures.get("notes") or []
        if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
            raise SummaryError(f"summary: {path}.notes must be a list of sentences,"
                               f" not {_describe(notes)}")
        _require_numbers(_require_object(figures.get("run"), f"{path}.run"), f"{path}.run")
        _check_throughput(_require_object(figures.get("throughput"), f"{path}.throughput"),
                          f"{path}.throughput")
        _check_cpu(_require_object(figures.get("cpu"), f"{path}.cpu"), f"{path}.cpu")
        _require_numbers(_require_object(figures.get("failover"), f"{path}.failover"),
                         f"{path}.failover")
        latencies = _require_object(figures.get("latency_ms"), f"{path}.latency_ms")
        for kind in LATENCY_KINDS:
            latency_path = f"{path}.latency_ms.{kind}"
            _check_latency(_require_object(latencies.get(kind), latency_path), latency_path)
        _check_checks(_require_object(figures.get("checks"), f"{path}.checks"), f"{path}.checks")
    cross = _require_object(summary.get("cross_backend"), "cross_backend")
    _check_checks(_require_object(cross.get("checks"), "cross_backend.checks"),
                  "cross_backend.checks")


def _without_non_finite(value):
    """A deep copy of C{value} with NaN and infinities as None: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _without_non_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_non_finite(item) for item in value]
    return value


def _all_checks(summary):
    """Every check of the summary that applies (and so counts toward the verdict)."""
    for figures in summary["backends"].values():
        yield from filter(check_applies, (figures.get("checks") or {}).values())
    cross = (summary.get("cross_backend") or {}).get("checks") or {}
    yield from filter(check_applies, cross.values())


def write_report(summary, out_dir):
    """
    Writes the report for C{summary} into C{out_dir} (created if needed): the
    four PNG charts, C{report.html} with them embedded, then C{summary.json}.

    The caller's dict is not changed. NaN and infinite figures become null (the
    page shows them as n/a); a summary without a verdict gets one from its
    checks (C{fail} if any failed; one not applicable counts for neither).

    @param summary: the analysis summary (see the module docstring).
    @param out_dir: a directory path.
    @return: the summary as written to C{summary.json}: C{"verdict"} first and
        C{"charts"} mapping each chart to its file name in C{out_dir}.
    @raise SummaryError: the summary is not shaped as the report expects.
    """
    summary = _without_non_finite(summary)
    check_summary(summary)
    if "verdict" not in summary:
        outcomes = {check_outcome(check) for check in _all_checks(summary)}
        summary["verdict"] = "fail" if FAIL in outcomes else "pass"
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"report directory {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    images = {
        "throughput": throughput_chart(summary),
        "confirm_latency": latency_cdf_chart(summary, "confirm", CONFIRM_LATENCY_TITLE),
        "end_to_end_latency": latency_cdf_chart(summary, "end_to_end", END_TO_END_LATENCY_TITLE),
        "correctness": correctness_chart(summary),
    }
    for key, png in images.items():
        (out_dir / CHART_FILES[key]).write_bytes(png)
    written = {"verdict": summary["verdict"], **summary, "charts": dict(CHART_FILES)}
    (out_dir / HTML_FILE).write_text(render_html(written, images), encoding="utf-8")
    (out_dir / SUMMARY_FILE).write_text(json.dumps(written, indent=2, allow_nan=False) + "\n",
                                        encoding="utf-8")
    return written


def read_summary(path):
    """The summary stored in a C{summary.json} file; L{SummaryError} if it cannot be read as one."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as problem:
        raise SummaryError(f"cannot read summary {path}: {problem.strerror or problem}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as problem:
        raise SummaryError(f"summary {path} is not JSON: {problem}") from None


PROGRAM = "brokerd-report"  # the console script; python -m spark_jobs.report runs the same


def build_parser(prog=PROGRAM):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Re-render the validation report (report.html, PNG charts, summary.json)"
                    " from a summary.json.",
    )
    parser.add_argument("summary", metavar="SUMMARY_JSON",
                        help="a summary.json written by the validation")
    parser.add_argument("out_dir", metavar="OUT_DIR",
                        help="directory for the report (created if needed)")
    return parser


def main(argv=None, prog=PROGRAM):
    """Renders the report as C{prog}; status 0 once written (whatever the verdict), 2 for unusable
    input."""
    options = build_parser(prog).parse_args(argv)
    try:
        written = write_report(read_summary(options.summary), options.out_dir)
    except (SummaryError, OSError) as problem:
        print(f"report: {problem}", file=sys.stderr)
        return 2
    print(f"verdict {written['verdict']}: {pathlib.Path(options.out_dir) / HTML_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m spark_jobs.report"))
