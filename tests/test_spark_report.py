"""The validation report: files, charts, the HTML page and its command line,
from synthetic summaries (no Spark, no broker)."""

import base64
import json
import pathlib
import re
import struct
import subprocess
import sys

import pytest
from matplotlib.image import imread

from spark_jobs.charts import FAIL_COLOUR, PASS_COLOUR, per_second_counts
from spark_jobs.report import CHART_FILES, SummaryError, write_report
from spark_jobs.events import BACKEND_CHECKS, CROSS_BACKEND_CHECKS as CROSS_CHECKS
from spark_jobs.settings import WorkloadSettings

ROOT = pathlib.Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE_EXAMPLE = "p0-000000042 body <script>alert('x')</script> & more"


def latency(scale):
    """A latency block whose CDF rises from C{scale} to 100 x C{scale} ms."""
    cdf = [[scale * (step + 1), (step + 1) / 100] for step in range(100)]
    return {"count": 1900, "p50": scale * 50, "p90": scale * 90, "p99": scale * 99, "max": scale * 100, "cdf": cdf}


def passing_check(checked):
    return {"pass": True, "checked": checked, "violations": 0, "examples": []}


def backend_figures(index):
    series = [
        {"second": second, "published": 400 + 10 * index, "delivered": 380, "published_bytes": 4_000_000,
         "delivered_bytes": 3_800_000}
        for second in range(6)
        if second != 3  # the broker was down in second 3: no point at all
    ]
    return {
        "run": {"wall_seconds": 5.5 + index, "crashes": 1, "published": 2000, "confirmed": 1990,
                "nacked_by_broker": 0, "delivered": 1912, "redelivered": 40, "acked": 1850, "nacked": 38,
                "rejected": 19, "stored": 150, "acks_lost_to_crash": 3},
        "throughput": {"publish_msgs_per_s": 363.6, "deliver_msgs_per_s": 347.6, "publish_mb_per_s": 3.64,
                       "deliver_mb_per_s": 3.48, "series": series},
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
    match = re.search(rf'<td class="(\w+)" data-check="{check}" data-column="{column}">(.*?)</td>', page, re.S)
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


def test_correctness_chart_paints_the_failure_red_and_the_passes_green(report, tmp_path):
    out_dir, _, _ = report
    assert pixels_of_colour(out_dir / "correctness.png", FAIL_COLOUR) > 1000
    assert pixels_of_colour(out_dir / "correctness.png", PASS_COLOUR) > 1000 * 8
    write_report(idle_backend_summary(), tmp_path)
    assert pixels_of_colour(tmp_path / "correctness.png", FAIL_COLOUR) == 0


def test_throughput_counts_a_second_missing_from_the_series_as_zero():
    series = three_backend_summary()["backends"]["sqlite"]["throughput"]["series"]
    assert per_second_counts(series, "published") == ([0, 1, 2, 3, 4, 5], [400, 400, 400, 0, 400, 400])
    assert per_second_counts([], "delivered") == ([], [])


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
         "backends.chunked.throughput.series[5].second must be an integer"),
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
