"""What can go wrong between a node and etcd, each failure its own class so callers can tell a
refusal (etcd answered no) from an outage (nobody answered) from a hostile answer."""


class EtcdError(Exception):
    """Anything the etcd client could not do; the message names the problem."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered (every one refused the connection, timed out or hung up)."""


class MalformedResponse(EtcdError):
    """An answer that is not what etcd's gateway sends: not JSON, a wrong type, bad base64,
    too large, or a line of a watch stream past its bound."""


class EtcdRefused(EtcdError):
    """
    etcd answered with an error (a non-200 status with the gateway's error object).

    @ivar code: the gRPC status code etcd gave (0 when it gave none).
    @ivar detail: etcd's own message.
    """

    def __init__(self, url, status, code, detail):
        super().__init__(f"etcd at {url} refused: {detail} (HTTP {status}, gRPC code {code})")
        self.code = code
        self.detail = detail


class LeaseNotFound(EtcdError):
    """The lease is gone in etcd (expired or revoked): whatever it held is gone with it."""


class DuplicateNodeName(EtcdError):
    """Another live node of the cluster already holds this node's name."""


class LeadershipLost(EtcdError):
    """This node is not (or no longer) the leader, so a leader's write was not made."""
