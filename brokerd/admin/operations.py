"""C{brokerd-admin}'s definitions, queues and connections commands::

    export FILE                          GET /api/definitions ('-': standard output)
    import FILE                          POST /api/definitions ('-': standard input)
    purge QUEUE [--vhost V]              DELETE /api/queues/V/QUEUE/contents
    close-connection NAME [--reason TEXT]    DELETE /api/connections/NAME (X-Reason: TEXT)
"""

import sys

from brokerd.admin.client import AdminError, segment
from brokerd.admin.command import Command, add_vhost_option, done, vhost_of


def _file_argument(what):
    def add_arguments(parser):
        parser.add_argument("file", metavar="FILE",
                            help=f"the definitions file ('-': standard {what})")
    return add_arguments


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
    done(out, f"Exported definitions to {arguments.file}")


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
    source = "standard input" if arguments.file == "-" else arguments.file
    done(out, f"Imported definitions from {source}")


def _purge_arguments(parser):
    parser.add_argument("queue", metavar="QUEUE")
    add_vhost_option(parser)


def purge_queue(client, arguments, out):
    vhost = vhost_of(arguments)
    client.request("DELETE", f"/api/queues/{segment(vhost)}/{segment(arguments.queue)}/contents")
    done(out, f"Purged queue {arguments.queue} in vhost {vhost}")


def _close_arguments(parser):
    parser.add_argument("name", metavar="NAME",
                        help="the connection's name, as list connections shows it")
    parser.add_argument("--reason", metavar="TEXT",
                        help="the text the client is given"
                             " (default: the API's, 'Closed via management plugin')")


def close_connection(client, arguments, out):
    headers = {"X-Reason": arguments.reason} if arguments.reason is not None else {}
    client.request("DELETE", f"/api/connections/{segment(arguments.name)}", headers=headers)
    done(out, f"Closed connection {arguments.name}")


DEFINITION_COMMANDS = [
    Command("export",
            "write the broker's definitions (RabbitMQ's JSON) to FILE ('-': standard output)",
            _file_argument("output"), export_definitions),
    Command("import", "import definitions (RabbitMQ's JSON) from FILE ('-': standard input)",
            _file_argument("input"), import_definitions),
]
QUEUE_COMMANDS = [
    Command("purge", "remove every ready message from a queue", _purge_arguments, purge_queue),
]
CONNECTION_COMMANDS = [
    Command("close-connection", "close a client connection (320 CONNECTION_FORCED)",
            _close_arguments, close_connection),
]
