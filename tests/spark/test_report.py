"""The validation report: files, charts, the HTML page and its command line,
from synthetic summaries (no Spark, no broker). The charts are checked on the
matplotlib Figures they are drawn from (which lines, styles, ticks and
texts), the page on its HTML."""

import base64
import html
import json
import pathlib
import re
import struct
import subprocess
import sys

import pytest
from matplotlib.colors import to_rgba
from matplotlib.image import imread

from spark_jobs.charts import latency_cdf_figure, log_ticks, series_rates, throughput_figure
from spark_jobs.correctness_chart import FAIL_COLOUR, NOT_APPLICABLE_COLOUR, PASS_COLOUR, correctness_figure
from spark_jobs.events import BACKEND_CHECKS, CHECK_DESCRIPTIONS
from spark_jobs.events import CROSS_BACKEND_CHECKS as CROSS_CHECKS
from spark_jobs.report import CHART_FILES, SummaryError, write_report
from spark_jobs.settings import WorkloadSettings
from tests.support.paths import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE_EXAMPLE = "p0-000000042 body <script>alert('x')</script> & more"


def latency(scale):
    """A latency block whose CDF rises from C{scale} to 100 x C{scale} ms."""
    cdf = [[scale * (step + 1), (step + 1) / 100] for step in range(100)]
    return {"count": 1900, "p50": scale * 50, "p90": scale * 90, "p99": scale * 99, "max": scale * 100, "cdf": cdf}


def passing_check(checked):
    return {"pass": True, "checked": checked, "violations": 0, "examples": []}


BUCKET = 0.5


def series_point(bucket, published, delivered):
    """One throughput bucket of L{BUCKET} seconds, 10 kB messages."""
    return {"start_s": bucket * BUCKET, "published": published, "delivered": delivered,
            "published_bytes": published * 10_000, "delivered_bytes": delivered * 10_000,
            "publish_msgs_per_s": published / BUCKET, "deliver_msgs_per_s": delivered / BUCKET,
            "publish_mb_per_s": published * 0.01 / BUCKET, "deliver_mb_per_s": delivered * 0.01 / BUCKET}


def backend_figures(index):
    # The broker was down in buckets 6 and 7: no points at all. Every backend delivers alike.
    series = [series_point(bucket, 200 + 5 * index, 190) for bucket in range(12) if bucket not in (6, 7)]
    return {
        "run": {"wall_seconds": 5.5 + index, "crashes": 1, "published": 2000, "confirmed": 1990,
                "nacked_by_broker": 0, "delivered": 1912, "redelivered": 40, "acked": 1850, "nacked": 38,
                "rejected": 19, "stored": 150, "acks_lost_to_crash": 3},
        "throughput": {"publish_msgs_per_s": 363.6 + 9 * index, "deliver_msgs_per_s": 347.6, "publish_mb_per_s": 3.64,
                       "deliver_mb_per_s": 3.48, "publish_active_s": [0.0, 5.5 + 0.1 * index],
                       "deliver_active_s": [0.2, 5.9], "bucket_seconds": BUCKET, "series": series},
        "latency_ms": {"confirm": latency(0.5 * (index + 1)), "end_to_end": latency(2.0 * (index + 1))},
        "checks": {name: passing_check(1990) for name in BACKEND_CHECKS},
    }


def three_backend_summary():
    """sqlite, filelog and chunked; filelog fails C{stored_matches_published} with a hostile example."""
    backends = {name: backend_figures(index) for index, name in enumerate(("sqlite", "filelog", "chunked"))}
    backends["filelog"]["checks"]["stored_matches_published"] = {
        "pass": False, "checked": 150, "violations": 7, "examples": [HOSTILE_EXAMPLE, "p1-000000007 missing"],
    }
    return {
        "settings": WorkloadSettings().to_json(),
        "backends": backends,
        "cross_backend": {"checks": {name: passing_check(2000) for name in CROSS_CHECKS}},
        "verdict": "fail",  # last here; summary.json puts it first
    }


def idle_backend_summary():
    """One backend that published and delivered nothing."""
    return {
        "verdict": "pass",
        "settings": WorkloadSettings(messages=1).to_json(),
        "backends": {
            "memory": {
                "run": {"wall_seconds": 0.4, "crashes": 0, "published": 0, "confirmed": 0, "delivered": 0},
                "throughput": {"publish_msgs_per_s": 0.0, "deliver_msgs_per_s": 0.0, "series": []},
                # No latency measured: percentiles of nothing, whether left null or zero, are n/a.
                "latency_ms": {"confirm": {"count": 0, "p50": 0.0, "p90": 0.0, "p99": None, "max": None, "cdf": []},
                               "end_to_end": {"count": 0, "cdf": []}},
                "checks": {"confirmed_delivered_or_stored": passing_check(0)},
            }
        },
    }


def png_size(data):
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])


def correctness_cell(page, check, column):
    match = re.search(rf'<td class="(\w+)" data-check="{check}" data-column="{column}"[^>]*>(.*?)</td>', page, re.S)
    assert match, f"no correctness cell for {check} / {column}"
    return match.group(1), match.group(2)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of the three-backend summary: (out_dir, returned summary, the page)."""
    out_dir = tmp_path_factory.mktemp("report") / "nested" / "out"
    written = write_report(three_backend_summary(), out_dir)
    return out_dir, written, (out_dir / "report.html").read_text(encoding="utf-8")


def test_every_file_is_written_and_every_chart_is_a_real_png(report):
    out_dir, _, _ = report
    assert sorted(path.name for path in out_dir.iterdir()) == sorted(
        ["summary.json", "report.html", *CHART_FILES.values()]
    )
    for name in CHART_FILES.values():
        data = (out_dir / name).read_bytes()
        width, height = png_size(data)
        assert 600 <= width <= 2000 and 400 <= height <= 1500, (name, width, height)
        assert len(data) > 10_000, name  # axes, lines and labels, not a blank canvas


def pixels_of_colour(png_path, colour):
    """How many pixels of a PNG are exactly C{colour} (``#rrggbb``)."""
    image = imread(png_path)[:, :, :3]
    wanted = [int(colour[index:index + 2], 16) / 255 for index in (1, 3, 5)]
    return int((abs(image - wanted) < 1 / 255).all(axis=2).sum())


def test_correctness_chart_paints_the_failure_red_and_the_passes_green(report):
    out_dir, _, _ = report
    assert pixels_of_colour(out_dir / "correctness.png", FAIL_COLOUR) > 1000
    assert pixels_of_colour(out_dir / "correctness.png", PASS_COLOUR) > 1000 * 8
    # The idle backend failed nothing: no red cell (red is only in the colour key under the matrix).
    matrix = correctness_figure(idle_backend_summary()).subfigs[0].axes[0]
    assert to_rgba(PASS_COLOUR) in [patch.get_facecolor() for patch in matrix.patches]
    assert to_rgba(FAIL_COLOUR) not in [patch.get_facecolor() for patch in matrix.patches]


def test_throughput_series_count_a_missing_bucket_as_zero():
    throughput = three_backend_summary()["backends"]["sqlite"]["throughput"]
    starts, rates, width = series_rates(throughput, "publish_msgs_per_s")
    assert width == BUCKET
    assert starts == [bucket * BUCKET for bucket in range(12)]
    assert rates == [400.0] * 6 + [0, 0] + [400.0] * 4
    assert series_rates({"series": []}, "deliver_msgs_per_s") == ([], [], 1.0)


def per_second_summary():
    """The three-backend summary as written before series had bucket widths: counts per whole second."""
    summary = three_backend_summary()
    for figures in summary["backends"].values():
        throughput = figures["throughput"]
        for key in ("bucket_seconds", "publish_active_s", "deliver_active_s"):
            del throughput[key]
        throughput["series"] = [{"second": second, "published": 400, "delivered": 380, "published_bytes": 4_000_000,
                                 "delivered_bytes": 3_800_000} for second in range(6) if second != 3]
    return summary


def test_a_summary_of_per_second_counts_still_renders(tmp_path):
    summary = per_second_summary()
    assert series_rates(summary["backends"]["sqlite"]["throughput"], "publish_mb_per_s") == (
        [0, 1, 2, 3, 4, 5], [4.0, 4.0, 4.0, 0, 4.0, 4.0], 1.0)
    write_report(summary, tmp_path)
    assert png_size((tmp_path / CHART_FILES["throughput"]).read_bytes()) == (1200, 750)
    [published] = [line for line in throughput_figure(summary).axes[0].lines if line.get_gid() == "series sqlite"]
    assert list(published.get_ydata()) == [400, 400, 400, 0, 400, 400]


def lines_by_backend(axes, role):
    """The lines a throughput panel drew for C{role} (C{series} or C{mean}), by backend name."""
    return {line.get_gid().split(" ", 1)[1]: line for line in axes.lines
            if (line.get_gid() or "").startswith(role + " ")}


THROUGHPUT_FIELDS = ("publish_msgs_per_s", "publish_mb_per_s", "deliver_msgs_per_s", "deliver_mb_per_s")


def test_every_backend_appears_in_every_throughput_panel_in_its_own_style():
    summary = three_backend_summary()
    panels = throughput_figure(summary).axes
    assert [axes.get_title() for axes in panels] == [
        "published messages per second", "published megabytes per second",
        "delivered messages per second", "delivered megabytes per second"]
    assert [axes.get_ylabel() for axes in panels] == ["msgs/s", "MB/s", "msgs/s", "MB/s"]
    for axes, field in zip(panels, THROUGHPUT_FIELDS):
        lines = lines_by_backend(axes, "series")
        assert list(lines) == ["sqlite", "filelog", "chunked"]
        for looks in (lambda line: line.get_color(), lambda line: line.get_linestyle(),
                      lambda line: line.get_marker()):
            assert len({looks(line) for line in lines.values()}) == 3, field
        for name, line in lines.items():
            assert list(line.get_ydata()) == series_rates(summary["backends"][name]["throughput"], field)[1]
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        assert [text.split(":")[0] for text in legend] == ["sqlite", "filelog", "chunked"]
    # Every backend delivered alike: the three lines coincide, yet each is
    # drawn narrower than the one under it and marks points of its own.
    delivered = list(lines_by_backend(panels[2], "series").values())
    assert delivered[0].get_ydata().tolist() == delivered[1].get_ydata().tolist() == delivered[2].get_ydata().tolist()
    widths = [line.get_linewidth() for line in delivered]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3
    assert [line.get_zorder() for line in delivered] == sorted(line.get_zorder() for line in delivered)
    assert len({line.get_markevery()[0] for line in delivered}) == 3
    assert all(line.get_markerfacecolor() == "none" for line in delivered)


def test_the_throughput_chart_draws_the_tables_mean_rates_over_each_active_span():
    summary = three_backend_summary()
    for axes, field in zip(throughput_figure(summary).axes, THROUGHPUT_FIELDS):
        means = lines_by_backend(axes, "mean")
        legend = [text.get_text() for text in axes.get_legend().get_texts()]
        for name, figures in summary["backends"].items():
            throughput = figures["throughput"]
            assert means[name].get_ydata().tolist() == [throughput[field]] * 2
            assert means[name].get_xdata().tolist() == throughput[field.split("_")[0] + "_active_s"]
            unit = "msgs/s" if "msgs" in field else "MB/s"
            shown = f"{throughput[field]:,.1f}" if unit == "msgs/s" else f"{throughput[field]:,.3f}"
            assert f"{name}: mean {shown} {unit}" in legend
        # Rates, not counts: a 0.5 s bucket of 200 published messages is 400 msgs/s.
        top = max(max(line.get_ydata()) for line in axes.lines)
        assert axes.get_ylim()[1] > top
    assert lines_by_backend(throughput_figure(summary).axes[0], "series")["sqlite"].get_ydata()[0] == 400.0


def test_latency_axes_are_ticked_in_plain_milliseconds():
    summary = three_backend_summary()
    summary["backends"]["sqlite"]["latency_ms"]["confirm"]["cdf"] = [[0.6, 0.0], [12.0, 0.5], [20_000.0, 1.0]]
    [axes] = latency_cdf_figure(summary, "confirm", "confirm latency").axes
    assert axes.get_xscale() == "log"
    assert [label.get_text() for label in axes.get_xticklabels()] == ["1", "10", "100", "1,000", "10,000"]
    assert not any(label.get_text() for label in axes.get_xticklabels(minor=True))
    assert axes.get_legend().get_texts()[0].get_text() == "sqlite (p50 25 ms, p99 49.5 ms)"
    # Too narrow a range for three powers of ten: 1-2-5 steps, still plain.
    assert log_ticks(3.0, 80.0) == [5, 10, 20, 50]
    assert log_ticks(0.004, 0.03) == pytest.approx([0.005, 0.01, 0.02])


def test_backends_keep_one_style_across_the_charts():
    summary = three_backend_summary()
    throughput = lines_by_backend(throughput_figure(summary).axes[0], "series")
    [latency] = latency_cdf_figure(summary, "end_to_end", "end-to-end").axes
    for line, name in zip(latency.lines, summary["backends"]):
        assert (line.get_color(), line.get_linestyle(), line.get_marker()) == (
            throughput[name].get_color(), throughput[name].get_linestyle(), throughput[name].get_marker())


def test_summary_json_round_trips_with_the_verdict_first_and_the_charts(report):
    out_dir, written, _ = report
    stored = json.loads((out_dir / "summary.json").read_text())
    assert stored == written
    assert next(iter(stored)) == "verdict"
    assert stored["verdict"] == "fail"
    assert stored["charts"] == {
        "throughput": "throughput.png",
        "confirm_latency": "confirm_latency_cdf.png",
        "end_to_end_latency": "end_to_end_latency_cdf.png",
        "correctness": "correctness.png",
    }
    assert stored["backends"]["filelog"]["checks"]["stored_matches_published"]["violations"] == 7
    assert stored["settings"] == WorkloadSettings().to_json()


def test_write_report_leaves_the_callers_summary_alone(tmp_path):
    summary = three_backend_summary()
    write_report(summary, tmp_path)
    assert summary == three_backend_summary()


def test_page_names_every_backend_and_check_and_shows_the_verdict(report):
    _, _, page = report
    banner = re.search(r'<div class="verdict fail"[^>]*>(.*?)</div>', page).group(1)
    assert banner == "FAIL: 1 check failed<ul><li>filelog: stored_matches_published</li></ul>"
    for name in ("sqlite", "filelog", "chunked"):
        assert f"<th>{name}</th>" in page
    for name in BACKEND_CHECKS + CROSS_CHECKS:
        assert f"<th>{name}</th>" in page
    assert "<th>crash_every</th><td>0</td>" in page
    assert "<th>confirm</th><td>yes</td>" in page
    assert "<th>sizes</th><td>64, 1024, 16384</td>" in page


def test_page_shows_the_failing_cell_with_its_count_and_escaped_example(report):
    _, _, page = report
    outcome, text = correctness_cell(page, "stored_matches_published", "filelog")
    assert outcome == "fail"
    assert "7 violations of 150 checked" in text
    assert "p0-000000042 body &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in text
    assert "p1-000000007 missing" in text
    assert "<script" not in page
    assert correctness_cell(page, "stored_matches_published", "sqlite")[0] == "pass"
    assert correctness_cell(page, "same_bodies", "all")[0] == "pass"
    assert correctness_cell(page, "same_bodies", "sqlite")[0] == "absent"


def test_page_is_self_contained_with_the_four_charts_embedded(report):
    out_dir, _, page = report
    assert not re.search(r'(src|href)\s*=\s*"?https?:', page, re.I)
    assert "<link" not in page and "@import" not in page
    embedded = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 4
    assert sorted(base64.b64decode(data) for data in embedded) == sorted(
        (out_dir / name).read_bytes() for name in CHART_FILES.values()
    )


def test_page_lists_each_backends_figures(report):
    _, _, page = report
    figures = page.split('<table id="figures">', 1)[1].split("</table>", 1)[0]
    assert re.search(r"<th>published</th>(<td class=\"number\">2,000</td>){3}</tr>", figures)
    assert re.search(r"<th>acks lost to a crash</th>(<td class=\"number\">3</td>){3}</tr>", figures)
    assert '<th>publish MB/s</th><td class="number">3.640</td>' in figures
    # sqlite's confirm p99 is 0.5 * 99 ms; chunked's end-to-end max is 6 * 100 ms.
    assert '<th>p99</th><td class="number">49.5</td>' in figures
    assert re.search(r'<th>max</th>(<td class="number">[\d.,]+</td>){2}<td class="number">600</td></tr>\s*$',
                     figures.split("end-to-end latency", 1)[1])


def test_a_single_backend_with_no_deliveries_renders_with_n_a(tmp_path):
    written = write_report(idle_backend_summary(), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert written["verdict"] == "pass"
    assert '<div class="verdict pass"' in page
    confirm = page.split("confirm latency (ms)", 1)[1].split("end-to-end latency (ms)", 1)[0]
    end_to_end = page.split("end-to-end latency (ms)", 1)[1].split("</table>", 1)[0]
    assert '<th>count</th><td class="number">0</td>' in confirm
    for rows in (confirm, end_to_end):
        for figure in ("p50", "p90", "p99", "max"):
            assert f'<th>{figure}</th><td class="number">n/a</td>' in rows
    assert '<th>redelivered</th><td class="number">n/a</td>' in page
    assert "<th>same_messages</th>" not in page
    assert "No cross-backend checks were computed" in page
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == 4
    for name in CHART_FILES.values():
        assert png_size((tmp_path / name).read_bytes())[0] >= 600


NOT_APPLICABLE_REASON = "RabbitMQ's store cannot be exported"


def summary_with_checks_not_applicable():
    """filelog's failing check and two more marked not applicable, one still saying it failed."""
    summary = three_backend_summary()
    del summary["verdict"]
    summary["backends"]["filelog"]["checks"]["stored_matches_published"] = {
        "applicable": False, "reason": NOT_APPLICABLE_REASON, "checked": 0, "violations": 0, "examples": []}
    summary["backends"]["chunked"]["checks"]["acked_not_redelivered"] = {
        "applicable": False, "pass": False, "reason": "acks <unseen> & unknown"}
    summary["cross_backend"]["checks"]["same_bodies"] = {"applicable": False, "reason": "one run only"}
    return summary


def test_a_check_not_applicable_shows_as_n_a_with_its_reason_and_leaves_the_verdict_alone(tmp_path):
    written = write_report(summary_with_checks_not_applicable(), tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert written["verdict"] == "pass"
    assert re.search(r'<div class="verdict pass"[^>]*>PASS: every check passed</div>', page)
    outcome, text = correctness_cell(page, "stored_matches_published", "filelog")
    assert outcome == "na"
    assert text == f'<span class="result">n/a</span><span class="reason">{html.escape(NOT_APPLICABLE_REASON)}</span>'
    outcome, text = correctness_cell(page, "acked_not_redelivered", "chunked")
    assert outcome == "na" and "acks &lt;unseen&gt; &amp; unknown" in text and "FAIL" not in text
    cross = page.split('<table id="cross-backend">', 1)[1].split("</table>", 1)[0]
    assert re.search(r'<tr><th>same_bodies</th><td class="na"[^>]*><span class="result">n/a</span>'
                     r'<span class="reason">one run only</span></td>', cross)


def test_the_correctness_chart_marks_checks_not_applicable_n_a_and_explains_every_check():
    figure = correctness_figure(summary_with_checks_not_applicable())
    matrix, key = figure.subfigs[0].axes[0], figure.subfigs[1].axes[0]
    cells = [patch for patch in matrix.patches if patch.get_facecolor() == to_rgba(NOT_APPLICABLE_COLOUR)]
    assert len(cells) == 3
    texts = [text.get_text() for text in matrix.texts]
    assert texts.count("n/a") == 3 and not any(text.startswith("FAIL") for text in texts)
    explained = [text.get_text() for text in key.texts]
    for name in BACKEND_CHECKS + CROSS_CHECKS:
        assert explained[explained.index(name) + 1] == CHECK_DESCRIPTIONS[name]
    assert "n/a: not applicable to this run" in [text.get_text() for text in key.get_legend().get_texts()]


def test_page_explains_every_check(report):
    _, _, page = report
    meanings = page.split('<table id="check-meanings">', 1)[1].split("</table>", 1)[0]
    for name in BACKEND_CHECKS + CROSS_CHECKS:
        assert f"<tr><th>{name}</th><td>{html.escape(CHECK_DESCRIPTIONS[name])}</td></tr>" in meanings


def test_cpu_figures_and_the_backend_kind_are_shown_when_the_summary_has_them(tmp_path, report):
    summary = three_backend_summary()
    summary["backends"]["sqlite"]["cpu"] = {"broker_cores": 0.93, "client_cores": 1.41, "limit": "broker",
                                            "samples": 12}
    summary["backends"]["filelog"]["cpu"] = {"broker_cores": None, "client_cores": 1.9, "limit": "clients"}
    summary["backends"]["chunked"]["kind"] = "reference"
    write_report(summary, tmp_path)
    figures = (tmp_path / "report.html").read_text().split('<table id="figures">', 1)[1].split("</table>", 1)[0]
    assert "<tr><th>kind</th><td>backend</td><td>backend</td><td>reference</td></tr>" in figures
    assert ('<tr><th>broker cores busy</th><td class="number">0.93</td><td class="number">n/a</td>'
            '<td class="number">n/a</td></tr>') in figures
    assert '<tr><th>client cores busy</th><td class="number">1.41</td><td class="number">1.90</td>' in figures
    assert "<tr><th>limited by</th><td>broker</td><td>clients</td><td>n/a</td></tr>" in figures
    assert '<tr><th>samples</th><td class="number">12</td>' in figures
    legend = [text.get_text() for text in throughput_figure(summary).axes[0].get_legend().get_texts()]
    assert legend[2].startswith("chunked (reference): mean")
    # A summary without them has neither.
    _, _, page = report
    plain = page.split('<table id="figures">', 1)[1].split("</table>", 1)[0]
    assert "<th>kind</th>" not in plain and "cores busy" not in plain and ">cpu<" not in plain


def test_a_summary_without_a_verdict_takes_it_from_its_checks(tmp_path):
    summary = three_backend_summary()
    del summary["verdict"]
    assert write_report(summary, tmp_path / "failing")["verdict"] == "fail"
    summary["backends"]["filelog"]["checks"]["stored_matches_published"] = passing_check(150)
    assert write_report(summary, tmp_path / "passing")["verdict"] == "pass"


def test_non_finite_figures_are_written_as_null_and_shown_as_n_a(tmp_path):
    summary = idle_backend_summary()
    summary["backends"]["memory"]["throughput"]["publish_msgs_per_s"] = float("nan")
    written = write_report(summary, tmp_path)
    assert written["backends"]["memory"]["throughput"]["publish_msgs_per_s"] is None
    assert '<th>publish msgs/s</th><td class="number">n/a</td>' in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda summary: summary.pop("backends"), "backends is missing or empty"),
        (lambda summary: summary.update(verdict="maybe"), "verdict must be 'pass' or 'fail'"),
        (lambda summary: summary["backends"].update(sqlite=[]), "backends.sqlite must be an object"),
        (lambda summary: summary["backends"]["chunked"]["checks"]["same"].pop("pass"),
         "backends.chunked.checks.same.pass must be true or false"),
        (lambda summary: summary["backends"]["chunked"]["throughput"]["series"].append({"published": 3}),
         "backends.chunked.throughput.series[10].start_s must be a number >= 0"),
        (lambda summary: summary["backends"]["chunked"]["throughput"]["series"].append({"second": -1}),
         "backends.chunked.throughput.series[10].second must be an integer >= 0"),
        (lambda summary: summary["backends"]["sqlite"]["throughput"].update(bucket_seconds=0),
         "backends.sqlite.throughput.bucket_seconds must be above 0"),
        (lambda summary: summary["backends"]["sqlite"]["throughput"].update(deliver_active_s=[3.0, 1.0]),
         "backends.sqlite.throughput.deliver_active_s must be a [from, to] pair"),
        (lambda summary: summary["backends"]["chunked"]["checks"]["same"].update(applicable="no"),
         "backends.chunked.checks.same.applicable must be true or false"),
        (lambda summary: summary["backends"]["chunked"]["checks"]["same"].update(applicable=False, reason=3),
         "backends.chunked.checks.same.reason must be a string"),
        (lambda summary: summary["backends"]["sqlite"].update(cpu={"client_cores": 1.0, "limit": "disk"}),
         "backends.sqlite.cpu.limit must be one of broker, clients, unknown"),
        (lambda summary: summary["backends"]["sqlite"].update(cpu={"broker_cores": "most"}),
         "backends.sqlite.cpu.broker_cores must be a number"),
        (lambda summary: summary["backends"]["sqlite"].update(kind="mirror"),
         "backends.sqlite.kind must be one of backend, reference"),
        (lambda summary: summary["backends"]["sqlite"]["latency_ms"]["confirm"]["cdf"].append([1.0]),
         "backends.sqlite.latency_ms.confirm.cdf[100] must be a [latency_ms, fraction] pair"),
        (lambda summary: summary["backends"]["sqlite"]["run"].update(published="many"),
         "backends.sqlite.run.published must be a number"),
    ],
)
def test_a_misshapen_summary_is_refused_naming_the_part(tmp_path, change, named):
    summary = three_backend_summary()
    summary["backends"]["chunked"]["checks"]["same"] = passing_check(1)
    change(summary)
    with pytest.raises(SummaryError, match=re.escape(named)):
        write_report(summary, tmp_path)
    assert not any(tmp_path.iterdir())


def run_report_command(*args):
    return subprocess.run([sys.executable, "-m", "spark_jobs.report", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_command_line_re_renders_a_report_from_its_summary_json(report, tmp_path):
    out_dir, written, _ = report
    result = run_report_command(out_dir / "summary.json", tmp_path / "again")
    assert result.returncode == 0, result.stderr
    assert "verdict fail" in result.stdout
    assert json.loads((tmp_path / "again" / "summary.json").read_text()) == written
    for name in CHART_FILES.values():
        assert (tmp_path / "again" / name).read_bytes() == (out_dir / name).read_bytes()


def test_command_line_names_an_unreadable_summary(tmp_path):
    missing = run_report_command(tmp_path / "nowhere.json", tmp_path / "out")
    assert missing.returncode == 2
    assert "cannot read summary" in missing.stderr and "nowhere.json" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"verdict": ')
    not_json = run_report_command(broken, tmp_path / "out")
    assert not_json.returncode == 2
    assert "broken.json is not JSON" in not_json.stderr
    assert not (tmp_path / "out").exists()
