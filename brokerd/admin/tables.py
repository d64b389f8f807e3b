"""The one table printer of brokerd's command lines: a header line of column names, then one
line per object with the columns aligned.

    >>> print(table(["name", "tags"], [{"name": "guest", "tags": ["administrator"]}]), end="")
    name   tags
    guest  administrator

Columns name fields of the objects the management API answers; a dotted name
reaches into a nested object (C{queue.name}). L{cell} says how a value shows.
"""

import json

COLUMN_GAP = "  "


def field(row, name):
    """The value of a (dotted) column name in one listed object, None when it is not there."""
    value = row
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def cell(value):
    """A value as a table shows it: nothing for None, lists comma-separated, objects as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def table(columns, rows):
    """
    A header line and aligned columns, one line per row (no trailing spaces).

    @param columns: the field names to show, in order; they head the columns.
    @param rows: the objects (dicts, as the API's JSON decodes) to show, one a line.
    """
    cells = [list(columns)] + [[cell(field(row, column)) for column in columns] for row in rows]
    widths = [max(len(line[index]) for line in cells) for index in range(len(columns))]
    return "".join(
        COLUMN_GAP.join(text.ljust(width) for text, width in zip(line, widths)).rstrip() + "\n"
        for line in cells
    )
