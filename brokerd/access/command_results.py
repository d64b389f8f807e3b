"""What a management command answers, and the log line a change leaves.

Shared by every module of rabbitmqctl's commands (L{brokerd.access.commands},
L{brokerd.access.topic_commands}): a L{Table} of text for a listing, L{DONE}
for a change, which L{done} logs in the words of RabbitMQ's log lines.
"""

from typing import NamedTuple

from twisted.logger import Logger

# The namespace operators have filtered these lines by since before this module was split out:
log = Logger(namespace="brokerd.access.commands")


class Table(NamedTuple):
    """A command's answer: column names and rows of text (both empty for a change)."""

    columns: tuple
    rows: list


DONE = Table((), [])


def done(user, what, **fields):
    """
    Log a change that was made, in the words of RabbitMQ's log lines and with
    who made it; returns L{DONE}.
    """
    log.info(what + " (by user '{acting_user}')", acting_user=user, **fields)
    return DONE
