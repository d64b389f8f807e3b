"""The logs a crash client writes as it goes, and reading them back after the broker was killed.

They live in the client's output directory and must outlive the broker's death,
so each is opened for appending and line-buffered: a line is written as soon as it is known.
"""

from crashloop.body import format_id, parse_id

# ``C PUBLISHER FIRST LAST`` (confirmed) or ``N PUBLISHER FIRST LAST`` (nacked) per answered range.
CONFIRMED_LOG = "confirmed.log"
# ``A MARKER ID ID...``: acks a confirmed marker publish proved durable.
ACKED_LOG = "acked.log"
# ``S MARKER ID ID...``: acks about to be sent, durable or not.
ACKS_SENT_LOG = "acks-sent.log"


class ClientLogs:
    """The three logs of one client run in directory C{out}, opened for appending and line-buffered."""

    def __init__(self, out):
        self.confirmed = open(out / CONFIRMED_LOG, "a", buffering=1)
        self.acked = open(out / ACKED_LOG, "a", buffering=1)
        self.acks_sent = open(out / ACKS_SENT_LOG, "a", buffering=1)

    def close(self):
        self.confirmed.close()
        self.acked.close()
        self.acks_sent.close()


def log_answered(record, ack, publisher, first, last):
    """Log that publisher C{publisher}'s messages C{first..last} were confirmed (C{ack}) or nacked."""
    record.write(f"{'C' if ack else 'N'} {publisher} {first} {last}\n")


def log_acks(record, kind, marker, ids):
    """Log the C{ids} acked before marker C{marker}: C{kind} is ``S`` (about to be sent) or ``A`` (durable)."""
    record.write(f"{kind} {marker} {' '.join(map(format_id, ids))}\n")


def read_confirmed(path):
    """confirmed.log as a list of C{(publisher, first, last, acked)} ranges."""
    ranges = []
    if path.exists():
        for line in path.read_text().splitlines():
            kind, publisher, first, last = line.split()
            ranges.append((int(publisher), int(first), int(last), kind == "C"))
    return ranges


def read_ids(path):
    """The ids in acked.log or acks-sent.log (lines ``KIND MARKER ID ID...``)."""
    ids = set()
    if path.exists():
        for line in path.read_text().splitlines():
            _, _, *texts = line.split()
            ids.update(parse_id(text) for text in texts)
    return ids
