"""C{brokerd-admin list KIND [--vhost V]}: the objects of one kind, as a table or
as the API's JSON."""

import json

from brokerd.admin.client import segment
from brokerd.admin.command import Command, add_vhost_option
from brokerd.admin.tables import table


class Listing:
    """
    One kind C{list} shows: its path for every vhost, for one vhost (None: no
    such path), and its columns.
    """

    def __init__(self, path, vhost_path, columns):
        self.path = path
        self.vhost_path = vhost_path
        self.columns = columns  # field names; a dotted name reaches into a nested object


LISTINGS = {
    "queues": Listing("/api/queues", "/api/queues/{vhost}",
                      ["vhost", "name", "messages", "messages_ready", "messages_unacknowledged",
                       "consumers"]),
    "exchanges": Listing("/api/exchanges", "/api/exchanges/{vhost}",
                         ["vhost", "name", "type", "durable", "auto_delete", "internal"]),
    "bindings": Listing("/api/bindings", "/api/bindings/{vhost}",
                        ["vhost", "source", "destination", "destination_type", "routing_key"]),
    "connections": Listing("/api/connections", "/api/vhosts/{vhost}/connections",
                           ["name", "user", "vhost", "protocol", "channels"]),
    "channels": Listing("/api/channels", "/api/vhosts/{vhost}/channels",
                        ["name", "user", "vhost", "consumer_count", "messages_unacknowledged",
                         "prefetch_count"]),
    "consumers": Listing("/api/consumers", "/api/consumers/{vhost}",
                         ["queue.vhost", "queue.name", "consumer_tag", "channel_details.name",
                          "ack_required", "exclusive", "prefetch_count"]),
    "vhosts": Listing("/api/vhosts", None,
                      ["name", "messages", "messages_ready", "messages_unacknowledged"]),
    "users": Listing("/api/users", None, ["name", "tags"]),
    "permissions": Listing("/api/permissions", "/api/vhosts/{vhost}/permissions",
                           ["user", "vhost", "configure", "write", "read"]),
    "topic_permissions": Listing("/api/topic-permissions", "/api/vhosts/{vhost}/topic-permissions",
                                 ["user", "vhost", "exchange", "write", "read"]),
    "policies": Listing("/api/policies", "/api/policies/{vhost}",
                        ["vhost", "name", "pattern", "apply-to", "definition", "priority"]),
    "parameters": Listing("/api/parameters", None, ["vhost", "component", "name", "value"]),
    "global-parameters": Listing("/api/global-parameters", None, ["name", "value"]),
    "vhost-limits": Listing("/api/vhost-limits", "/api/vhost-limits/{vhost}", ["vhost", "value"]),
    "user-limits": Listing("/api/user-limits", None, ["user", "value"]),
}


def add_arguments(parser):
    parser.add_argument("kind", choices=list(LISTINGS), metavar="KIND", help=", ".join(LISTINGS))
    add_vhost_option(parser, "every vhost; users: every user")


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


COMMANDS = [
    Command(
        "list",
        "list the objects of one KIND (queues, exchanges, users, policies, ...: see list --help)",
        add_arguments, list_objects,
        "List the objects of one kind, in one vhost or in all: a table of their useful fields,"
        " or with --format json the API's JSON as it answered.",
    ),
]
