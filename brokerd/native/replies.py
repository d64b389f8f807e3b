"""The envelopes the native server answers a client's request with.

An answer goes on the request's channel with its correlation id, so that the
client matches it to the Deferred waiting for it.
"""

from brokerd.proto.native_pb2 import Envelope


def reply_to(request):
    """An empty envelope answering C{request} (same channel and correlation id), to fill in."""
    return Envelope(channel=request.channel, correlation_id=request.correlation_id)


def ok_frame(request):
    """The encoded C{ok} answering C{request}: what a request without a result of its own gets."""
    reply = Envelope(channel=request.channel, correlation_id=request.correlation_id)
    reply.ok.SetInParent()
    return reply.SerializeToString()
