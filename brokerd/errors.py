"""Broker errors, each carrying its AMQP 0-9-1 reply code and level.

A L{ChannelError} closes the channel it happened on; a L{BrokerConnectionError} closes
the whole connection. Both wire adapters turn these into their protocol's close
methods, so the rules that raise them live once, in the model and the channel.
"""


class BrokerError(Exception):
    """An error a client caused; C{reply_code} and C{name} are AMQP's."""

    reply_code = 541
    name = "INTERNAL_ERROR"
    closes_connection = True

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    @property
    def reply_text(self):
        """The AMQP reply text: code name, a dash, then what went wrong."""
        return f"{self.name} - {self.text}"

    def __str__(self):
        return f"{self.reply_code} {self.reply_text}"


class ChannelError(BrokerError):
    """A soft error: only the channel closes."""

    closes_connection = False


class BrokerConnectionError(BrokerError):
    """A hard error: the connection closes."""

    closes_connection = True


class ContentTooLarge(ChannelError):
    """The message is larger than the broker accepts."""

    reply_code = 311
    name = "CONTENT_TOO_LARGE"


class NoRoute(ChannelError):
    """A mandatory message matched no queue (used in basic.return)."""

    reply_code = 312
    name = "NO_ROUTE"


class AccessRefused(ChannelError):
    """The client may not do this: reserved names, exclusive use."""

    reply_code = 403
    name = "ACCESS_REFUSED"


class NotFound(ChannelError):
    """The named exchange or queue does not exist."""

    reply_code = 404
    name = "NOT_FOUND"


class ResourceLocked(ChannelError):
    """Another connection holds the exclusive queue."""

    reply_code = 405
    name = "RESOURCE_LOCKED"


class PreconditionFailed(ChannelError):
    """The request conflicts with existing state or has bad values."""

    reply_code = 406
    name = "PRECONDITION_FAILED"


class ConnectionForced(BrokerConnectionError):
    """The broker is closing the connection (shutdown)."""

    reply_code = 320
    name = "CONNECTION_FORCED"


class InvalidPath(BrokerConnectionError):
    """The virtual host name is not valid."""

    reply_code = 402
    name = "INVALID_PATH"


class FrameError(BrokerConnectionError):
    """A frame could not be read or is larger than allowed."""

    reply_code = 501
    name = "FRAME_ERROR"


class FrameSyntaxError(BrokerConnectionError):
    """A frame carried values that are not allowed."""

    reply_code = 502
    name = "SYNTAX_ERROR"


class CommandInvalid(BrokerConnectionError):
    """A method was sent where it is not allowed."""

    reply_code = 503
    name = "COMMAND_INVALID"


class InvalidChannel(BrokerConnectionError):
    """A frame named a channel that is not open, or opened one twice."""

    reply_code = 504
    name = "CHANNEL_ERROR"


class UnexpectedFrame(BrokerConnectionError):
    """A frame arrived out of order."""

    reply_code = 505
    name = "UNEXPECTED_FRAME"


class NotAllowed(BrokerConnectionError):
    """The connection may not do this, e.g. open an unknown vhost."""

    reply_code = 530
    name = "NOT_ALLOWED"


class MethodNotImplemented(BrokerConnectionError):
    """The method is not implemented."""

    reply_code = 540
    name = "NOT_IMPLEMENTED"


class InternalError(BrokerConnectionError):
    """The broker failed; the client did nothing wrong."""

    reply_code = 541
    name = "INTERNAL_ERROR"
