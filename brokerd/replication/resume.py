"""Whether a follower may resume a leader's stream where it stopped, or needs a snapshot.

A leader's operations are numbered on from the stream it followed before it
was elected: its I{history} lists, newest first, the epochs of the leaders
it followed and the sequence where each ended in its own stream. A follower
says the epoch and sequence its stores hold. It resumes when that position
is in the leader's history and the leader still keeps the operations after
it; otherwise (ahead of the leader, an epoch the leader never followed,
operations no longer kept, stores last written as a leader's) it resyncs.
"""

from brokerd.replication import codec


def resync_reason(stream, epoch, history, follower_epoch, follower_sequence, flags):
    """
    None when a follower at C{(follower_epoch, follower_sequence)} may resume
    the leader's C{stream} (of C{epoch}, after C{history}); else why it needs
    a snapshot, in words naming the positions.
    """
    if flags & codec.NOT_RESUMABLE:
        return ("its stores were last written as a leader's, or hold an unfinished snapshot"
                " or data of unknown origin")
    if follower_epoch == epoch:
        end = stream.last_sequence
    else:
        end = next((last for known, last in history if known == follower_epoch), None)
        if end is None:
            return (f"it holds epoch {follower_epoch}, which is not in the history of this"
                    f" leader (epoch {epoch})")
    if follower_sequence > end:
        return (f"it is at operation {follower_sequence} of epoch {follower_epoch}, ahead of"
                f" this leader's {end} for that epoch")
    if follower_sequence + 1 < stream.first_retained:
        return (f"it is at operation {follower_sequence}; the leader keeps operations from"
                f" {stream.first_retained} only")
    return None
