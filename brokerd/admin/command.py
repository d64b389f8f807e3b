"""What every C{brokerd-admin} command is: a name, a one-line summary, its
arguments and what it does.

The command modules (L{brokerd.admin.listing}, L{brokerd.admin.access},
L{brokerd.admin.operations}, L{brokerd.admin.migration}) each hold a list of
L{Command}s; L{brokerd.admin.cli} groups them by task into one parser.
"""

import argparse

DEFAULT_VHOST = "/"


class Command:
    """
    One C{brokerd-admin} command.

    @ivar name: the word that names it on the command line (C{add-user}).
    @ivar summary: the one line C{brokerd-admin --help} shows for it.
    @ivar add_arguments: called with its argparse parser to add its arguments.
    @ivar run: called with the L{brokerd.admin.client.ManagementClient}, the
        parsed arguments and the output stream; returns None once done (or an
        exit status), raises L{brokerd.admin.client.AdminError} when not done.
    @ivar description: the paragraph its own C{--help} shows (the summary if None).
    """

    def __init__(self, name, summary, add_arguments, run, description=None):
        self.name = name
        self.summary = summary
        self.add_arguments = add_arguments
        self.run = run
        self.description = description or summary


def add_vhost_option(parser, default_text=DEFAULT_VHOST):
    """
    C{--vhost V} (also rabbitmqctl's C{-p V}) after the command; the global C{--vhost} before
    the command is the same setting, so the one given here wins and, when none is, the global
    one stands.
    """
    parser.add_argument("-p", "--vhost", default=argparse.SUPPRESS, metavar="V",
                        help=f"the vhost (default: {default_text})")


def vhost_of(arguments):
    """The vhost a per-vhost command acts on: the one given, else C{/}."""
    return arguments.vhost if arguments.vhost is not None else DEFAULT_VHOST


def done(out, line):
    """Say on C{out} what a command did, in one line."""
    out.write(line + "\n")
