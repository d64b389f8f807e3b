"""``twistd brokerd``: command-line options and the service they build.

Imported by twistd only when the ``brokerd`` subcommand is used, so ``twistd
--help`` stays fast. Option values are checked here, before anything starts; a
bad value ends twistd with a one-line error naming the option.
"""

import sys

from twisted.internet.endpoints import serverFromString
from twisted.python import usage

from brokerd import storeregistry
from brokerd.native.server import DEFAULT_MAX_FRAME_SIZE
from brokerd.service import BrokerService
from brokerd.units import parse_size

DEFAULT_BACKEND = "memory"
DEFAULT_DATA_DIR = "./brokerd-data"
DEFAULT_NATIVE = "tcp:5673:interface=127.0.0.1"


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Runs brokerd, a message broker following the AMQP 0-9-1 model, with the"
        " chosen storage backend. Endpoint options take Twisted endpoint strings"
        " (e.g. tcp:5673:interface=0.0.0.0, unix:/run/brokerd.sock)."
    )

    optParameters = [
        [
            "backend",
            None,
            DEFAULT_BACKEND,
            "Storage backend and its options, NAME[:key=value...]; see --help-backends.",
        ],
        ["data-dir", None, DEFAULT_DATA_DIR, "Directory where durable backends keep their files."],
        ["native", None, DEFAULT_NATIVE, "Endpoint for the native protobuf protocol; 'none' to disable it."],
        [
            "native-max-frame",
            None,
            str(DEFAULT_MAX_FRAME_SIZE),
            "Largest native-protocol frame accepted, in bytes (K, M, G suffixes allowed);"
            " a larger one closes that client's connection.",
        ],
    ]

    def opt_help_backends(self):
        """List the storage backends and their options, then exit."""
        for line in storeregistry.describe_backends():
            print(line)
        sys.exit(0)

    def parseOptions(self, options=None):
        try:
            super().parseOptions(options)
        except usage.UsageError as problem:
            raise SystemExit(f"twistd brokerd: {problem}") from None

    def postOptions(self):
        from twisted.internet import reactor

        try:
            self["native-max-frame"] = parse_size(self["native-max-frame"])
        except ValueError as problem:
            raise usage.UsageError(f"--native-max-frame: {problem}") from None
        if self["native"].lower() == "none":
            self["native"] = None
        else:
            try:
                serverFromString(reactor, self["native"])
            except (ValueError, KeyError, TypeError) as problem:
                raise usage.UsageError(f"--native: {self['native']!r} is not a valid endpoint: {problem}") from None
        try:
            self["store"] = storeregistry.make_store(self["backend"], self["data-dir"])
        except storeregistry.BackendError as problem:
            raise usage.UsageError(f"--backend: {problem}") from None


def makeService(options):
    from twisted.internet import reactor

    return BrokerService(
        options["store"],
        reactor,
        native_endpoint=options["native"],
        native_max_frame_size=options["native-max-frame"],
    )
