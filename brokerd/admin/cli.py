"""C{brokerd-admin} (also C{python -m brokerd.admin}): list, export, import, purge and close over the HTTP API.

    brokerd-admin list queues --vhost /
    brokerd-admin --format json list connections
    brokerd-admin export backup.json        # '-': standard output
    brokerd-admin import backup.json        # '-': standard input
    brokerd-admin purge jobs
    brokerd-admin close-connection '127.0.0.1:50412 -> 127.0.0.1:5672' --reason 'maintenance'

It logs in to the management API at C{--url} (default C{http://127.0.0.1:15672})
as C{--user} with C{--password} (defaults: C{$BROKERD_USER}, C{$BROKERD_PASSWORD},
else guest/guest, as C{python -m brokerd.native}). Tables have a header line and
aligned columns; C{--format json} prints the API's JSON as it answered. Exit
status 0 when the command did what it says; 1 when it did not, with one line on
standard error (C{error: HTTP 401 not_authorised - Login failed}, or the URL it
could not reach); 2 for a command line that does not parse.
"""

import argparse
import json
import os
import sys

from brokerd.admin.client import AdminError, ManagementClient, segment

DEFAULT_URL = "http://127.0.0.1:15672"
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
DEFAULT_PURGE_VHOST = "/"


class Listing:
    """One kind C{list} shows: its path for every vhost, for one vhost (None: no such path), and its columns."""

    def __init__(self, path, vhost_path, columns):
        self.path = path
        self.vhost_path = vhost_path
        self.columns = columns  # field names; a dotted name reaches into a nested object


LISTINGS = {
    "queues": Listing("/api/queues", "/api/queues/{vhost}",
                      ["vhost", "name", "messages", "messages_ready", "messages_unacknowledged", "consumers"]),
    "exchanges": Listing("/api/exchanges", "/api/exchanges/{vhost}",
                         ["vhost", "name", "type", "durable", "auto_delete", "internal"]),
    "bindings": Listing("/api/bindings", "/api/bindings/{vhost}",
                        ["vhost", "source", "destination", "destination_type", "routing_key"]),
    "connections": Listing("/api/connections", "/api/vhosts/{vhost}/connections",
                           ["name", "user", "vhost", "protocol", "channels"]),
    "channels": Listing("/api/channels", "/api/vhosts/{vhost}/channels",
                        ["name", "user", "vhost", "consumer_count", "messages_unacknowledged", "prefetch_count"]),
    "consumers": Listing("/api/consumers", "/api/consumers/{vhost}",
                         ["queue.vhost", "queue.name", "consumer_tag", "channel_details.name", "ack_required",
                          "exclusive", "prefetch_count"]),
    "vhosts": Listing("/api/vhosts", None, ["name", "messages", "messages_ready", "messages_unacknowledged"]),
    "users": Listing("/api/users", None, ["name", "tags"]),
    "permissions": Listing("/api/permissions", "/api/vhosts/{vhost}/permissions",
                           ["user", "vhost", "configure", "write", "read"]),
}


def build_parser():
    parser = argparse.ArgumentParser(prog="brokerd-admin", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the management API (default: {DEFAULT_URL})")
    parser.add_argument("--user", default=os.environ.get("BROKERD_USER", DEFAULT_USER),
                        help=f"user to log in as (default: $BROKERD_USER, else {DEFAULT_USER})")
    parser.add_argument("--password", default=os.environ.get("BROKERD_PASSWORD", DEFAULT_PASSWORD),
                        help=f"that user's password (default: $BROKERD_PASSWORD, else {DEFAULT_PASSWORD})")
    parser.add_argument("--vhost", default=None,
                        help="the vhost of list and purge (default: every vhost for list, / for purge)")
    parser.add_argument("--format", choices=["table", "json"], default="table", help="output (default: table)")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list objects of one kind")
    listing.add_argument("kind", choices=list(LISTINGS))
    export = commands.add_parser("export", help="write the broker's definitions to FILE ('-': standard output)")
    export.add_argument("file")
    load = commands.add_parser("import", help="import definitions from FILE ('-': standard input)")
    load.add_argument("file")
    purge = commands.add_parser("purge", help="remove every ready message from a queue")
    purge.add_argument("queue")
    close = commands.add_parser("close-connection", help="close a client connection (320 CONNECTION_FORCED)")
    close.add_argument("name", help="the connection's name, as list connections shows it")
    close.add_argument("--reason", help="the text the client is given (default: the API's,"
                                        " 'Closed via management plugin')")
    return parser


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
    """A header line and aligned columns, one line per row (no trailing spaces)."""
    cells = [columns] + [[cell(field(row, column)) for column in columns] for row in rows]
    widths = [max(len(line[index]) for line in cells) for index in range(len(columns))]
    return "".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() + "\n" for line in cells)


def list_objects(client, arguments, out):
    listing = LISTINGS[arguments.kind]
    path = listing.path
    if arguments.vhost is not None and listing.vhost_path is not None:
        path = listing.vhost_path.format(vhost=segment(arguments.vhost))
    rows, text = client.get_json(path)
    if arguments.kind == "vhosts" and arguments.vhost is not None:
        rows = [row for row in rows if row.get("name") == arguments.vhost]
        text = json.dumps(rows)
    if arguments.format == "json":
        out.write(text if text.endswith("\n") else text + "\n")
    else:
        out.write(table(listing.columns, rows))


def export_definitions(client, arguments, out):
    raw = client.request("GET", "/api/definitions")
    if arguments.file == "-":
        out.write(raw.decode("utf-8") + "\n")
        return
    try:
        with open(arguments.file, "wb") as file:
            file.write(raw)
    except OSError as error:
        raise AdminError(f"could not write {arguments.file}: {error.strerror}") from None
    out.write(f"Exported definitions to {arguments.file}\n")


def import_definitions(client, arguments, out):
    try:
        if arguments.file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(arguments.file, "rb") as file:
                raw = file.read()
    except OSError as error:
        raise AdminError(f"could not read {arguments.file}: {error.strerror}") from None
    client.request("POST", "/api/definitions", body=raw)
    out.write(f"Imported definitions from {'standard input' if arguments.file == '-' else arguments.file}\n")


def purge_queue(client, arguments, out):
    vhost = arguments.vhost if arguments.vhost is not None else DEFAULT_PURGE_VHOST
    client.request("DELETE", f"/api/queues/{segment(vhost)}/{segment(arguments.queue)}/contents")
    out.write(f"Purged queue {arguments.queue} in vhost {vhost}\n")


def close_connection(client, arguments, out):
    headers = {"X-Reason": arguments.reason} if arguments.reason is not None else {}
    client.request("DELETE", f"/api/connections/{segment(arguments.name)}", headers=headers)
    out.write(f"Closed connection {arguments.name}\n")


COMMANDS = {
    "list": list_objects,
    "export": export_definitions,
    "import": import_definitions,
    "purge": purge_queue,
    "close-connection": close_connection,
}


def main(argv=None, out=None):
    """Run one command; the exit status (0 done, 1 not done, with one line on standard error)."""
    arguments = build_parser().parse_args(argv)
    out = out if out is not None else sys.stdout
    client = ManagementClient(arguments.url, arguments.user, arguments.password)
    try:
        COMMANDS[arguments.command](client, arguments, out)
        out.flush()
    except AdminError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader (e.g. head) stopped reading: not an error to report
        if out is sys.stdout:  # as Python's documentation says: what is left to flush at exit goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
