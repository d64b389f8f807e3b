"""The correctness matrix of a validation summary: which check passed, failed
or did not apply on which backend, as data (L{correctness_matrix}, shared with
the HTML page) and as a chart with what each check means written under it.

A check's summary entry is C{{"pass": bool, "checked": n, "violations": n,
"examples": [...]}}; one marked C{"applicable": false} (with a C{"reason"})
was not applicable to that run, a check against a reference broker say, and
is shown as n/a: neither passed nor failed, and no part of the verdict.
"""

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from spark_jobs.charts import DPI, display_name, no_data, png
from spark_jobs.events import BACKEND_CHECKS, CHECK_DESCRIPTIONS, CROSS_BACKEND_CHECKS

CORRECTNESS_SIZE = (12.0, 8.5)  # inches; at DPI, 1200 x 850 pixels
CROSS_BACKEND_COLUMN = "all"
PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "n/a"

PASS_COLOUR = "#2e9d4a"
FAIL_COLOUR = "#d2352c"
NOT_APPLICABLE_COLOUR = "#9a9a9a"
ABSENT_COLOUR = "#e4e4e4"
OUTCOME_COLOURS = {PASS: PASS_COLOUR, FAIL: FAIL_COLOUR, NOT_APPLICABLE: NOT_APPLICABLE_COLOUR}
# The matrix keeps cells at most this small a share of its axes, so one
# backend with one check does not fill the picture with one cell.
MATRIX_MIN_COLUMNS, MATRIX_MIN_ROWS = 4, 9
# Where the sentences of the key under the matrix start, as a share of its width (after the
# longest check name).
KEY_TEXT_AT = 0.23


def check_outcome(check):
    """C{"pass"}, C{"fail"} or C{"n/a"} (marked C{"applicable": false}) for a check's summary
    entry."""
    if check.get("applicable") is False:
        return NOT_APPLICABLE
    return PASS if check["pass"] else FAIL


def _ordered(names, canonical):
    return ([name for name in canonical if name in names]
            + sorted(name for name in names if name not in canonical))


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
    backend_check_names = {name for figures in backends.values()
                           for name in (figures.get("checks") or {})}
    rows = []
    for name in _ordered(backend_check_names, BACKEND_CHECKS):
        cells = [(figures.get("checks") or {}).get(name) for figures in backends.values()]
        rows.append((name, cells + ([None] if cross else [])))
    for name in _ordered(set(cross), CROSS_BACKEND_CHECKS):
        rows.append((name, [None] * len(backends) + [cross[name]]))
    return columns, rows


def _cell_text(cell):
    outcome = check_outcome(cell)
    if outcome == NOT_APPLICABLE:
        return NOT_APPLICABLE
    violations = cell.get("violations")
    text = "pass" if outcome == PASS else "FAIL"
    return text + (f"\n{violations:,}" if violations is not None else "")


def _cell(column, row, colour):
    """One matrix cell, inset a little so neighbouring cells stay apart."""
    return Rectangle((column + 0.03, row + 0.05), 0.94, 0.9, facecolor=colour, edgecolor="none")


def _draw_matrix(axes, summary, columns, rows):
    for row_index, (_, cells) in enumerate(rows):
        for column_index, cell in enumerate(cells):
            colour = ABSENT_COLOUR if cell is None else OUTCOME_COLOURS[check_outcome(cell)]
            axes.add_patch(_cell(column_index, row_index, colour))
            if cell is not None:
                axes.text(column_index + 0.5, row_index + 0.5, _cell_text(cell), ha="center",
                          va="center", color="white", fontsize=9, fontweight="bold")
    backends = summary["backends"]
    labels = [display_name(column, backends[column]).replace(" (", "\n(")
              if column in backends else column
              for column in columns]
    axes.set_xlim(0, max(len(columns), MATRIX_MIN_COLUMNS))
    axes.set_ylim(max(len(rows), MATRIX_MIN_ROWS), 0)
    axes.set_xticks([index + 0.5 for index in range(len(columns))], labels)
    axes.set_yticks([index + 0.5 for index in range(len(rows))], [name for name, _ in rows])
    axes.xaxis.tick_top()
    axes.tick_params(length=0)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.set_title("correctness checks (violations per cell)", pad=24)


def _draw_key(figure, rows):
    """Under the matrix, across the figure: what each check of C{rows} means, then what the cell
    colours say."""
    axes = figure.subplots()
    axes.axis("off")
    lines = len(rows) + 1
    for index, (name, _) in enumerate(rows):
        y = 1 - (index + 0.5) / lines
        axes.text(0.0, y, name, fontsize=8.5, fontweight="bold", va="center",
                  transform=axes.transAxes)
        axes.text(KEY_TEXT_AT, y, CHECK_DESCRIPTIONS.get(name, ""), fontsize=8.5, va="center",
                  transform=axes.transAxes)
    colours = [Patch(color=PASS_COLOUR, label="passed"),
               Patch(color=FAIL_COLOUR, label="failed"),
               Patch(color=NOT_APPLICABLE_COLOUR, label="n/a: not applicable to this run"),
               Patch(color=ABSENT_COLOUR, label="not a check of this column")]
    axes.legend(handles=colours, loc="center left", bbox_to_anchor=(0.0, 0.5 / lines), ncols=4,
                fontsize=8.5, frameon=False, borderaxespad=0, handlelength=1.5)


def correctness_figure(summary):
    """
    The correctness Figure: the matrix, one row per check and one column per
    backend (plus L{CROSS_BACKEND_COLUMN}); a green cell passed, a red one
    failed, both show the violation count; a dark grey one says n/a, a light
    grey one is not a check of its column. Under it, a sentence per check.
    """
    columns, rows = correctness_matrix(summary)
    figure = Figure(figsize=CORRECTNESS_SIZE, dpi=DPI, layout="constrained")
    matrix_part, key_part = figure.subfigures(
        2, 1, height_ratios=[1.5 * max(len(rows), MATRIX_MIN_ROWS), len(rows) + 1])
    matrix_axes = matrix_part.subplots()
    _draw_matrix(matrix_axes, summary, columns, rows)
    if rows:
        _draw_key(key_part, rows)
    else:
        no_data(matrix_axes, "no checks computed")
    return figure


def correctness_chart(summary):
    """PNG bytes of L{correctness_figure}."""
    return png(correctness_figure(summary))
